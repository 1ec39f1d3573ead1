"""Ray's state API at Ray's import path: ``from ray.util.state import list_tasks`` becomes
``from raylite.util.state import list_tasks`` (see raylite.core.state_api)."""
from raylite.core.state_api import (ActorState, NodeState, ObjectState, PlacementGroupState, RayStateApiException,
                                    TaskState, WorkerState, get_actor, get_task, list_actors, list_nodes,
                                    list_objects, list_placement_groups, list_tasks, list_workers, summarize_actors,
                                    summarize_tasks)

__all__ = ["ActorState", "NodeState", "ObjectState", "PlacementGroupState", "RayStateApiException", "TaskState",
           "WorkerState", "get_actor", "get_task", "list_actors", "list_nodes", "list_objects",
           "list_placement_groups", "list_tasks", "list_workers", "summarize_actors", "summarize_tasks"]
