# the same machine, issued as soon as call 2 returned
WAIT_S=560 bash bench/gpu/long_detached.sh follow 2>&1 | tail -20
