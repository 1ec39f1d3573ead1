"""``ray.util.state.api``'s functions, for code that imports them from there."""
from raylite.util.state import (get_actor, get_job, get_log, get_node, get_objects, get_placement_group, get_task,
                                get_worker, list_actors, list_cluster_events, list_jobs, list_logs, list_nodes,
                                list_objects, list_placement_groups, list_runtime_envs, list_tasks, list_workers,
                                summarize_actors, summarize_objects, summarize_tasks)

__all__ = ["get_actor", "get_job", "get_log", "get_node", "get_objects", "get_placement_group", "get_task",
           "get_worker", "list_actors", "list_cluster_events", "list_jobs", "list_logs", "list_nodes", "list_objects",
           "list_placement_groups", "list_runtime_envs", "list_tasks", "list_workers", "summarize_actors",
           "summarize_objects", "summarize_tasks"]
