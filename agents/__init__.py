"""What the agent CLIs are and what they print, in the standard library only: the provider
tables (`providers`), their output (`agent_output`, `agent_message`), rate limits
(`ratelimit`), usage (`usage`), windows (`window_parse`), redaction (`redaction`), env files
(`envfile`), and the step guard that runs around each step with its egress relay's inside
half (`stepguard`, `egress`: scripts bound into the sandbox). Imports
only `domain`; everything above may import it (`tests/test_layers.py`)."""
