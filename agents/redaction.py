"""Secrets kept out of the ledger: a step's secret values replaced by a marker (no Django).

An agent is untrusted, and CLIs echo their key (`invalid x-api-key sk-...`). Before a step's
output tails (the live flushes too), its error, the events, cooldown reasons and the drain
evidence built from them are written, the runner replaces each secret value of the step by
`[redacted:NAME]` (`Redactor.redact`; runs.agent_step.StepWatch applies it to what the
process printed, so everything derived from it is clean too). `account check` does the same
to what it prints.

A step's secrets (`Redactor.for_environment`, then `with_secrets` of every secret loopsweb
itself holds, ledger.held_secrets: the other accounts' keys, the login files' tokens, the
GitHub token, SECRET_KEY, the database password):
1. every value of its account's env file (`--env-file`, agents.envfile), whatever its name;
2. every variable of the step's environment whose name looks secret (contains KEY, TOKEN,
   SECRET, PASSWORD, PASSWD or CREDENTIAL, in any case): the account's registered variables
   (the registry refuses such names, so this is a second line), what
   LOOPSWEB_AGENT_ENV_PASSTHROUGH lets through (a `GITHUB_TOKEN`, say), a command step's
   own `env`.

Values shorter than MIN_LENGTH (8) characters are never redacted: too short to be a key, and
short enough to appear in ordinary output by chance (`1`, `true`, a port). Matching is by
exact substring, longest value first, plus the value as JSON escapes it (when that differs);
a value cut by the start of a kept tail is not recognised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

MIN_LENGTH = 8
MARKER = "[redacted:{name}]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """True for a variable name that looks like it holds a secret (module docstring, "whose
    name looks secret")."""
    return bool(SECRET_NAME.search(name))


class Redactor:
    """`redact(text)`: `text` with each secret value replaced by `[redacted:NAME]`."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        self._secrets = dict(secrets or {})
        markers: dict[str, str] = {}
        for name, value in (secrets or {}).items():
            if not isinstance(value, str) or len(value) < MIN_LENGTH:
                continue
            for form in (value, json.dumps(value)[1:-1]):
                markers.setdefault(form, MARKER.format(name=name))
        self._markers = markers
        # Longest first: at each position the longest secret wins (one contains another).
        self._pattern = (
            re.compile(
                "|".join(re.escape(v) for v in sorted(markers, key=len, reverse=True))
            )
            if markers
            else None
        )

    @classmethod
    def for_environment(
        cls, env_file: Mapping[str, str], environment: Mapping[str, str]
    ) -> Redactor:
        """The secrets of a step (module docstring): every value of `env_file`, and the
        variables of `environment` whose names look secret."""
        secrets = {name: v for name, v in environment.items() if looks_secret(name)}
        secrets.update(env_file)
        return cls(secrets)

    def with_secrets(self, more: Mapping[str, str]) -> Redactor:
        """This redactor and `more`: a value both hold keeps this one's name (the step's own
        `ANTHROPIC_API_KEY`, not the installation's label for the same key)."""
        return Redactor(
            {
                **self._secrets,
                **{k: v for k, v in more.items() if k not in self._secrets},
            }
        )

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __repr__(self) -> str:  # never the values
        return f"Redactor({len(self._markers)} forms)"

    def redact(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(lambda found: self._markers[found.group(0)], text)

    def redact_optional(self, text: str | None) -> str | None:
        return None if text is None else self.redact(text)
