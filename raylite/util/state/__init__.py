"""Ray's state API at Ray's import path: ``from ray.util.state import list_tasks`` becomes
``from raylite.util.state import list_tasks`` (see raylite.core.api.state and, for the logs,
raylite.core.api.state_logs)."""
from raylite.core.api.state import (ActorState, ClusterEventState, JobState, NodeState, ObjectState,
                                    PlacementGroupState, RayStateApiException, RuntimeEnvState, TaskState,
                                    WorkerState, get_actor, get_job, get_node, get_objects, get_placement_group,
                                    get_task, get_worker, list_actors, list_cluster_events, list_jobs, list_nodes,
                                    list_objects, list_placement_groups, list_runtime_envs, list_tasks,
                                    list_workers, summarize_actors, summarize_objects, summarize_tasks)
from raylite.core.api.state_logs import get_log, list_logs

__all__ = ["ActorState", "ClusterEventState", "JobState", "NodeState", "ObjectState", "PlacementGroupState",
           "RayStateApiException", "RuntimeEnvState", "TaskState", "WorkerState", "get_actor", "get_job", "get_log",
           "get_node", "get_objects", "get_placement_group", "get_task", "get_worker", "list_actors",
           "list_cluster_events", "list_jobs", "list_logs", "list_nodes", "list_objects", "list_placement_groups",
           "list_runtime_envs", "list_tasks", "list_workers", "summarize_actors", "summarize_objects",
           "summarize_tasks"]
