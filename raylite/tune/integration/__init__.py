"""Ray's `ray.tune.integration` path; `ray_train.TuneReportCallback` is the one integration here."""
