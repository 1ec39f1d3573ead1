"""The node manager in the driver: scheduler, worker table, loop and failures, object table,
actors, placement groups, output, events and snapshots, and the driver's client onto it (driver).
May import: every layer below (wire, hardware, envs, client, worker)."""
