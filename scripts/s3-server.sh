#!/usr/bin/env bash
# A real S3 server (versitygw) on a free loopback port, for the S3 tests.
#
#   scripts/s3-server.sh start   # installs versitygw into .tools/bin once (~2 min),
#                                # starts it, creates a bucket and prints the
#                                # environment to use: eval "$(scripts/s3-server.sh start)"
#   scripts/s3-server.sh stop    # stops the server started by `start` (by its PID)
#
# State lives in .tools/s3/ (PID, port, data); .tools/ is not versioned.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools
STATE=$TOOLS/s3
VERSION=v1.8.0
ACCESS=tessera-test
SECRET=tessera-test-secret
BUCKET=tessera

install() {
    local bin=$TOOLS/bin/versitygw
    if [[ -x $bin && -f $TOOLS/bin/versitygw.version && $(cat "$TOOLS/bin/versitygw.version") == "$VERSION" ]]; then
        return
    fi
    local go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
    echo "installing versitygw $VERSION (once; about 2 minutes)" >&2
    GOBIN=$TOOLS/bin "$go" install "github.com/versity/versitygw/cmd/versitygw@$VERSION" >&2
    echo "$VERSION" >"$TOOLS/bin/versitygw.version"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    install
    if [[ -f $STATE/pid ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
        echo "already running (pid $(cat "$STATE/pid")); stop it first" >&2
        exit 1
    fi
    rm -rf "$STATE"
    mkdir -p "$STATE/data"
    local port
    port=$(free_port)
    ROOT_ACCESS_KEY=$ACCESS ROOT_SECRET_KEY=$SECRET \
        "$TOOLS/bin/versitygw" --port "127.0.0.1:$port" posix "$STATE/data" \
        >"$STATE/server.log" 2>&1 &
    echo $! >"$STATE/pid"
    echo "$port" >"$STATE/port"
    local e=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 # sha256 of ""
    for _ in $(seq 100); do
        if curl -sf -X PUT -H "x-amz-content-sha256: $e" --user "$ACCESS:$SECRET" \
            --aws-sigv4 "aws:amz:us-east-1:s3" "http://127.0.0.1:$port/$BUCKET" >/dev/null 2>&1; then
            echo "export TESSERA_TEST_S3=s3:http://127.0.0.1:$port/$BUCKET"
            echo "export AWS_ACCESS_KEY_ID=$ACCESS"
            echo "export AWS_SECRET_ACCESS_KEY=$SECRET"
            echo "export AWS_DEFAULT_REGION=us-east-1"
            return
        fi
        sleep 0.1
    done
    echo "versitygw did not start; see $STATE/server.log" >&2
    stop
    exit 1
}

stop() {
    if [[ -f $STATE/pid ]]; then
        local pid
        pid=$(cat "$STATE/pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        rm -f "$STATE/pid"
    fi
    rm -rf "$STATE/data"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    install) install ;;
    *) echo "usage: $0 start|stop|install" >&2; exit 2 ;;
esac
