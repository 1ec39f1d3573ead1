"""What every process of a job holds: ObjectRef and the link to the runtime that owns the
objects, streams' refs, the runtime-context state, sessions, logging and metrics, the Ray backend.
May import: wire, hardware, envs."""
