"""The environment variables the product code reads, found in its source with `ast`: the
settings an installation has. tests/test_serve.py holds the environment file template
(deploy/loopsweb.env.example) to them, tests/test_settings_docs.py docs/settings.md.

A variable counts when its name is a literal (or an f-string over the providers,
`f"LOOPSWEB_{provider.upper()}_BIN"`) passed to one of the settings readers (`ENV_READERS`)
or to `os.environ.get` / `os.getenv`; `NOT_SETTINGS` are read from the environment but are
not settings of an installation.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import source_index

ROOT = Path(__file__).resolve().parents[1]

ENV_READERS = {
    "env_str",
    "env_bool",
    "env_int",
    "env_list",
    "_exit_codes",
    "_passthrough",
}
# Read from the environment but not settings of an installation.
NOT_SETTINGS = {
    "HASNA_EVENT_JSON": "route_event's event input (upstream hook contract), per call",
    "Q_CLUSTER_NAME": "per process: scripts/serve.sh runs sets it for the run cluster",
}


def _literal_names(node: ast.AST, providers: list[str]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):
        # f"LOOPSWEB_{provider.upper()}_BIN": one name per provider
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{}")
        template = "".join(parts)
        assert template.count("{}") == 1, f"unexpected f-string {template}"
        return {template.format(p.upper()) for p in providers}
    if isinstance(node, ast.Name):
        # a reader forwarding its parameter (env_int(name, ...)): its callers count
        return set()
    raise AssertionError(f"an environment name that is not a literal: {ast.dump(node)}")


def settings_read_by_code() -> set[str]:
    """Every environment variable the product code reads that is a setting."""
    from django.conf import settings

    providers = list(settings.LOOPSWEB_PROVIDER_BINARIES)
    names: set[str] = set()
    sources = [
        p
        for package in ("domain", "agents", "ledger", "runs", "routing", "loopsweb")
        for p in (ROOT / package).rglob("*.py")
    ]
    for path in sources:
        for node in source_index.nodes(source_index.text(path), str(path)):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in ENV_READERS:
                names |= _literal_names(node.args[0], providers)
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in {"get", "getenv"}
                and ast.unparse(func.value) in {"os.environ", "os"}
            ):
                names |= _literal_names(node.args[0], providers)
    return names - set(NOT_SETTINGS) - {"DJANGO_SETTINGS_MODULE"}
