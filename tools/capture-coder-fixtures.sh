#!/usr/bin/env bash
# Captures Coder API fixtures from the fake Coder (mocks/) into tests/fixtures/coder/.
# The contract test checks every fixture against Coder v2.34.3's swagger.json, so the fakes and
# the fixtures are held to the real spec. Hand-made variants (omitted optional fields, unknown
# enum values) are written by tests/fixtures/coder/README.md's instructions, not by this script.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p mocks --bin fake-coder
out=tests/fixtures/coder
mkdir -p "$out"
log=$(mktemp)
./target/debug/fake-coder --scale 60 --gpus 1 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 1
url=$(awk '/fake Coder/ {print $3}' "$log")
tok=$(cat "$(awk '/owner token file/ {print $4}' "$log")")
create() { curl -sf -XPOST "$url/control/create" -H 'Content-Type: application/json' -d "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
a=$(create '{"owner":"alice","name":"alice-gpu","ttl_ms":28800000}')
sleep 2.5
create '{"owner":"bob","name":"bob-gpu"}' >/dev/null
sleep 4
get() { curl -s "$url$1" -H "Coder-Session-Token: $tok"; }
get "/api/v2/workspaces?q=status:running" >"$out/workspaces_running.json"
get /api/v2/users/me >"$out/user_owner.json"
get "/api/v2/users/me/keys/${tok%%-*}" >"$out/api_key.json"
get /api/v2/buildinfo >"$out/buildinfo.json"
stop() { curl -s -XPOST "$url/api/v2/workspaces/$a/builds" -H "Coder-Session-Token: $tok" -H 'Content-Type: application/json' -d '{"transition":"stop"}'; }
stop >"$out/workspace_build_stop_queued.json"
stop >"$out/error_409_build_active.json"
build=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$out/workspace_build_stop_queued.json")
sleep 2
get "/api/v2/workspacebuilds/$build" >"$out/workspace_build_stop_succeeded.json"
curl -s "$url/api/v2/workspaces" -H "Coder-Session-Token: 0123456789-notarealsecret" >"$out/error_401.json"
for f in "$out"/*.json; do python3 -m json.tool "$f" >"$f.tmp" && mv "$f.tmp" "$f"; done
echo "captured into $out"
