"""runtime_env on the local runtime: its checks and how a worker applies it (runtime_env), pip
and uv virtual environments (pip), working_dir and py_modules copies (working_dir).
May import: wire, hardware."""
