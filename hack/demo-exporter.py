#!/usr/bin/env python3
"""Demo traffic exporter: serves /metrics with request and latency series per
(namespace, app, version), as an instrumented application would.

The traffic of each version comes from a JSON file, re-read at every scrape, so the demo
can make a version good or bad while it runs:
    {"demo/checkout/1.4.2": {"error_ratio": 0.01, "latency_seconds": 0.08}}
Versions not in the file serve no traffic. Every scrape adds 100 requests per version.

    python3 hack/demo-exporter.py --port 9470 --traffic traffic.json
"""
import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
REQUESTS_PER_SCRAPE = 100.0


class Counters:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.requests = {}  # (ns, app, version, code) -> count
        self.buckets = {}  # (ns, app, version) -> [count per bucket, +Inf last]
        self.sums = {}

    def profiles(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def scrape(self):
        with self.lock:
            for key, p in self.profiles().items():
                parts = key.split("/")
                if len(parts) != 3:
                    continue
                ns, app, version = parts
                errors = REQUESTS_PER_SCRAPE * float(p.get("error_ratio", 0.0))
                latency = float(p.get("latency_seconds", 0.05))
                for code, n in (("200", REQUESTS_PER_SCRAPE - errors), ("500", errors)):
                    k = (ns, app, version, code)
                    self.requests[k] = self.requests.get(k, 0.0) + n
                counts = self.buckets.setdefault((ns, app, version), [0.0] * (len(BUCKETS) + 1))
                for i, le in enumerate(BUCKETS):
                    if latency <= le:
                        counts[i] += REQUESTS_PER_SCRAPE
                counts[-1] += REQUESTS_PER_SCRAPE
                self.sums[(ns, app, version)] = self.sums.get((ns, app, version), 0.0) + latency * REQUESTS_PER_SCRAPE
            return self.render()

    def render(self):
        out = [
            "# HELP http_requests_total Requests served, by version and status code.",
            "# TYPE http_requests_total counter",
        ]
        for (ns, app, version, code), n in sorted(self.requests.items()):
            out.append(f'http_requests_total{{namespace="{ns}",app="{app}",version="{version}",code="{code}"}} {n}')
        out += [
            "# HELP http_request_duration_seconds Time to answer a request.",
            "# TYPE http_request_duration_seconds histogram",
        ]
        for (ns, app, version), counts in sorted(self.buckets.items()):
            labels = f'namespace="{ns}",app="{app}",version="{version}"'
            for le, n in zip([str(b) for b in BUCKETS] + ["+Inf"], counts):
                out.append(f'http_request_duration_seconds_bucket{{{labels},le="{le}"}} {n}')
            out.append(f"http_request_duration_seconds_sum{{{labels}}} {self.sums[(ns, app, version)]}")
            out.append(f"http_request_duration_seconds_count{{{labels}}} {counts[-1]}")
        return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9470)
    parser.add_argument("--traffic", required=True, help="JSON file of traffic profiles")
    args = parser.parse_args()
    counters = Counters(args.traffic)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = counters.scrape().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
