"""What the probing agent (tests/probe_agent.py) reached, read from its output lines."""

from __future__ import annotations

from pathlib import Path


def breaches(probes: list[str], worktree: str) -> list[str]:
    """The probe lines that reached something outside the run. A listing that shows only
    the way to the run's own worktree (the sandbox makes its parent directories) is none; a
    write is judged on the host by the caller (inside, /tmp is the sandbox's own)."""
    found = []
    for line in probes:
        if ": REACHED" not in line or line.startswith("PROBE write "):
            continue
        if line.startswith("PROBE list "):
            listed = line[len("PROBE list ") :].split(": REACHED", 1)[0]
            shown = line.rsplit("(", 1)[1].rstrip(")").split(", ")
            inside = Path(worktree)
            if inside.is_relative_to(listed) and inside != Path(listed):
                if shown == [inside.relative_to(listed).parts[0]]:
                    continue
        found.append(line)
    return found
