"""The worker process: the zygote that forks workers, the worker loop, running calls
(executor, concurrency, results) and the client its user code calls through (client).
May import: wire, hardware, envs, client."""
