# Sourced by run.sh and test.sh: every agent step runs in a bubblewrap sandbox
# (docs/isolation.md §7). Installs Debian's bubblewrap when it is missing and we can (root with
# apt-get); otherwise says how, and loopsweb refuses write-enabled routes until it is there.
ensure_bwrap() {
  command -v bwrap >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's bubblewrap for the agent sandbox" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
  else
    echo "the agent sandbox needs bubblewrap: apt-get install bubblewrap (as root)," \
      "or LOOPSWEB_AGENT_SANDBOX=off to run agents unsandboxed" >&2
  fi
}
ensure_bwrap
