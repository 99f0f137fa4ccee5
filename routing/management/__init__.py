"""Management commands of the routing app (route_event, routes, drain, ingest_events,
schedule_drain, sync_schedules, prune_drains, api_token, ensure_staff_user, health) and `arguments`, the options they share. The top
layer: may import anything below it."""
