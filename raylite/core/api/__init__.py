"""The public API with Ray's names: init/get/put/wait (runtime), remote functions and actors,
submission, options, placement groups, the state API, the control endpoint and the dashboard.
The top layer: it may import every layer below."""
