"""Management commands of the routing app (route_event, drain, ingest_events, schedule_drain,
sync_schedules, api_token, ensure_staff_user) and `arguments`, the options they share. The top
layer: may import anything below it."""
