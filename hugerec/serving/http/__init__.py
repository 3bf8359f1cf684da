"""The server that strangers reach: routes, routing between versions, auth, metrics, the request log.

    server.py              InferenceServer: KServe v2 routes, /predict, /recommend; serve()
    limits.py              what one request may make the server do: body size and deadline (413, 408)
    versions.py            ModelVersions: the loaded versions of one served name, canary routing, draining
    admin.py               the admin API: load, load_delta, unload, canary, promote, rollback
    auth.py                who may call a write route: the admin token
    feedback.py            /feedback and /admin/logs/flush routes of the request log
    request_log.py         a sample of answered /predict rows and their feedback, as Parquet
    prometheus_metrics.py  the server's Prometheus registry
    status_page.py         the status page at /: what is served, and with the admin token versions, traffic, a loop's decisions

The top serving wing: it imports the others, none of them imports it.
"""
