"""The services tokenlake runs against, as local processes: lakeFS, MinIO (its S3 store) and
toxiproxy (faults on the wire), built from their Go modules at the versions
``deploy/services.toml`` pins (``python -m flows.services.build``, i.e. ``./dev services``)."""
