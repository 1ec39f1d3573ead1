"""Ray's `ray.tune.integration` path: `ray_train.TuneReportCallback` (a Train run inside a trial) and
`pytorch_lightning.TuneReportCallback` / `TuneReportCheckpointCallback` (Lightning's metrics)."""
