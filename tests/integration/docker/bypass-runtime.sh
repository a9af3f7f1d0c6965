#!/bin/sh
# A test-only OCI runtime: runc, except that the container never joins the network namespace
# Docker gave it and stays in the runtime's own (the host's). It stands for any runtime whose
# packets do not meet the netfilter rules of the namespace Docker assigned (gVisor's
# netstack does the same), so the suite can show that corral catches such a runtime.
# engine.sh installs it as the Docker runtime `corral-test-bypass`.
bundle=
prev=
for arg in "$@"; do
  case $prev in --bundle | -b) bundle=$arg ;; esac
  case $arg in --bundle=*) bundle=${arg#--bundle=} ;; esac
  prev=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  sed -i 's/,{"type":"network"[^}]*}//; s/{"type":"network"[^}]*},\{0,1\}//' "$bundle/config.json"
fi
exec runc "$@"
