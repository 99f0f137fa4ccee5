"""loopsweb settings, driven by the environment.

Every setting an operator may change is read from an environment variable (docs/settings.md
lists them all). A bad value raises ImproperlyConfigured naming the variable, at start-up, rather
than failing later in a request or a worker.

The settings are a package, one module per concern, read in this order (a later module reads
the values of earlier ones): `base` (paths, secrets, hosts, apps), `database`, `web` (static
files, the WSGI server, logins, HTTPS), `clusters` (django-q2, hosts, the admission lock,
logging), `agents` (the runner and its isolation) and `limits` (input sizes); `env` holds
the readers of the environment they share (`env_int` and the others).
"""

# In this order: each module's start-up checks run as the monolithic settings ran them.
# isort: off
from loopsweb.settings.base import *  # noqa: F403
from loopsweb.settings.database import *  # noqa: F403
from loopsweb.settings.web import *  # noqa: F403
from loopsweb.settings.clusters import *  # noqa: F403
from loopsweb.settings.agents import *  # noqa: F403
from loopsweb.settings.limits import *  # noqa: F403
# isort: on
