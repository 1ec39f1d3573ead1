"""``ray.util.state.common``'s record types, for code that imports them from there."""
from raylite.core.api.state import (ActorState, ClusterEventState, JobState, NodeState, ObjectState,
                                    PlacementGroupState, RuntimeEnvState, TaskState, WorkerState)

__all__ = ["ActorState", "ClusterEventState", "JobState", "NodeState", "ObjectState", "PlacementGroupState",
           "RuntimeEnvState", "TaskState", "WorkerState"]
