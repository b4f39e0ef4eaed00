#!/bin/sh
# The kernel pod's command (the image's CMD). Enterprise Gateway's pod template
# (kernel-pod.yaml.j2) passes the handshake's values in the environment, as it does for its own
# images' bootstrap-kernel.sh; this hands them to ivralo's launcher.
set -eu
exec python /usr/local/bin/launch_ivralo.py \
    --kernel-id "${KERNEL_ID}" \
    --port-range "${PORT_RANGE:-${EG_PORT_RANGE:-0..0}}" \
    --response-address "${RESPONSE_ADDRESS:-${EG_RESPONSE_ADDRESS}}" \
    --public-key "${PUBLIC_KEY:-${EG_PUBLIC_KEY}}"
