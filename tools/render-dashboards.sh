#!/usr/bin/env bash
# Pictures of the Grafana dashboards' data for docs/observability.md, rendered from a real
# Prometheus: Grafana itself cannot be installed here, so every panel's PromQL (Grafana variables
# substituted) is opened in Prometheus's own graph page in headless Chromium and screenshotted.
#
#   tools/render-dashboards.sh                 # a short shaped demo with --prometheus, then render
#   tools/render-dashboards.sh --data DIR      # render from an existing Prometheus data dir
#                                              # (e.g. a demo's RUN_DIR/prometheus-data)
#
# Writes docs/img/dashboards/<dashboard>-<panel>.png (dashboard: the JSON's name without
# "longhaul-"; panel: its title in lower-case-with-dashes). A query that errors or returns no
# series over the rendered range fails the script, naming dashboard, panel and query, so a picture
# never shows "No data" (panels marked "[GPU workers only]" are skipped, saying so, when no worker in
# the data computed on a GPU). Chromium and Python's PIL (cropping) come from Debian: when missing they are
# installed through `tools/setup.sh --render-tools`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: tools/render-dashboards.sh [options]

  --data DIR           render from this Prometheus data dir instead of running a demo
  --steps N            demo steps (default 150)
  --rate-mbit R        demo link rate (default 2: the int8 backward links run at their limit,
                       the TAH-Quant forward ones, with half the bytes, at about half of it)
  --run-dir DIR        the demo's run directory (default build/render-dashboards/<time>)
  --no-build           use build/bin as it is (default: build the three daemons first)
  --out DIR            where the PNGs go (default docs/img/dashboards; old PNGs there are removed)
  --width W            screenshot width in pixels (default 1200; the height fits the page)
  --rate-interval D    what $__rate_interval becomes (default 20s: Grafana's value for the 5 s
                       scrape interval of dashboards/prometheus.yml)
  --job-id REGEX       what $job_id becomes (default .*, Grafana's "All")
  --panels all|timeseries
                       which panels (default all; stat and bar-gauge panels are graphed over time)
  --markdown FILE      also write the gallery (per dashboard: picture and PromQL of each panel)
                       as Markdown, image paths relative to docs/
USAGE
}

data=""; steps=150; rate=2; run_dir=""; build=1; out="$ROOT/docs/img/dashboards"; width=1200
rate_interval=20s; job_id='.*'; panels=all; markdown=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rate-mbit) rate="$2"; shift 2 ;;
    --run-dir) run_dir="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --out) out="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --rate-interval) rate_interval="$2"; shift 2 ;;
    --job-id) job_id="$2"; shift 2 ;;
    --panels) panels="$2"; shift 2 ;;
    --markdown) markdown="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "render-dashboards: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$panels" == all || "$panels" == timeseries ]] || { echo "render-dashboards: --panels all|timeseries" >&2; exit 2; }
[[ "$width" =~ ^[0-9]+$ ]] || { echo "render-dashboards: --width needs a number" >&2; exit 2; }

command -v prometheus >/dev/null || { echo "render-dashboards: needs Debian's prometheus (tools/setup.sh)" >&2; exit 2; }
# Debian's python3-pil is for Debian's python3 (not one first on PATH, e.g. pyenv's).
py=python3; [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
if ! command -v chromium >/dev/null || ! "$py" -c 'import PIL' 2>/dev/null; then
  bash "$ROOT/tools/setup.sh" --render-tools
fi

# 1. The data: a short demo whose links are shaped, scraped by its own Prometheus.
if [[ -z "$data" ]]; then
  run_dir="${run_dir:-$ROOT/build/render-dashboards/$(date +%Y%m%d-%H%M%S)}"
  ((build)) && "$ROOT/longhaul.sh" build longhaul-coordinator longhaul-worker longhaulctl
  bash "$ROOT/tools/demo.sh" --prometheus --steps "$steps" --rate-mbit "$rate" --run-dir "$run_dir"
  data="$run_dir/prometheus-data"
fi
[[ -d "$data" ]] || { echo "render-dashboards: no Prometheus data dir at $data" >&2; exit 2; }
data="$(cd "$data" && pwd)"

# 2. Serve it again, scraping nothing (so the data ends where the run ended), on a free port.
listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
port=""
for p in $(seq 9290 9389); do listening 127.0.0.1 "$p" || { port=$p; break; }; done
[[ -n "$port" ]] || { echo "render-dashboards: no free port in 9290-9389" >&2; exit 1; }
tmp="$(mktemp -d)"
prom_pid=""
cleanup() {
  if [[ -n "$prom_pid" ]]; then
    kill -TERM "$prom_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$prom_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
printf 'global:\n  scrape_interval: 5s\n' >"$tmp/prometheus.yml"
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$data" \
  --web.listen-address="127.0.0.1:$port" >"$tmp/prometheus.log" 2>&1 &
prom_pid=$!
echo "render-dashboards: prometheus on http://127.0.0.1:$port serving $data"

# 3. Every panel's queries, checked through the API, then screenshotted in the graph page.
mkdir -p "$out"
rm -f "$out"/*.png
"$py" - "$ROOT" "http://127.0.0.1:$port" "$out" "$width" "$rate_interval" "$job_id" "$panels" \
  "$markdown" "$tmp" <<'PY'
import datetime, glob, json, math, os, re, subprocess, sys, time, urllib.parse, urllib.request
from PIL import Image, ImageChops

root, prom, out, width, rate_interval, job_id, which, markdown, tmp = sys.argv[1:]
width = int(width)

def api(path, **params):
    url = f"{prom}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=60) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]

# Ready once the data dir is loaded (replaying its write-ahead log takes a moment).
for _ in range(600):
    try:
        with urllib.request.urlopen(f"{prom}/-/ready", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    time.sleep(0.1)
else:
    sys.stderr.write(open(os.path.join(tmp, "prometheus.log")).read())
    sys.exit(f"render-dashboards: prometheus at {prom} did not become ready")

# The time the job ran: the first and last samples of its step gauge (any job in the data).
samples = [float(t) for s in api("query", query="longhaul_job_step[30d]")["result"] for t, _ in s["values"]]
if not samples:
    sys.exit("render-dashboards: the data has no longhaul_job_step samples (no job was scraped)")
# The graph page keeps its end time to the minute: end on a whole minute after the last sample.
end = (math.ceil(max(samples)) + 5 + 59) // 60 * 60
start = math.floor(min(samples)) - 10
span = end - start
range_input = f"{span}s"  # the graph page takes one unit only ("4m1s" is not understood)
end_input = datetime.datetime.fromtimestamp(end, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
step = max(1, span // 250)
print(f"render-dashboards: data from {min(samples):.0f} to {max(samples):.0f} ({span} s rendered, until {end_input} UTC)")

# Grafana's variables, as Grafana would send them for this range and "All" jobs.
subst = {"__rate_interval": rate_interval, "__interval": f"{max(step, 5)}s", "__range": f"{span}s",
         "job_id": job_id}
def substitute(expr):
    def var(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in subst:
            raise KeyError(f"no value for Grafana variable ${name} in {expr}")
        return subst[name]
    return re.sub(r"\$\{(\w+)\}|\[\[(\w+)\]\]|\$(\w+)", var, expr)

def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")

profile = os.path.join(tmp, "chromium-profile")
chromium = ["chromium", "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={profile}", "--virtual-time-budget=15000"]
if os.geteuid() == 0:
    chromium.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox

gallery, failures, skipped, total = [], [], [], 0
# Panels marked so in their description have series only where a worker computes on a GPU (as
# dashboards_test does: without one they are reported as skipped, not pictured as "No data").
GPU_ONLY = "[GPU workers only]"
gpu_workers = bool(api("query", query='count(count_over_time(up{job="longhaul-workers", device=~"cuda.*"}[30d]))')["result"])
# The job overview first, as in the docs' table of dashboards.
for path in sorted(glob.glob(os.path.join(root, "dashboards/grafana/*.json")), key=lambda p: ("overview" not in p, p)):
    dash = json.load(open(path))
    dname = re.sub(r"^longhaul-", "", os.path.splitext(os.path.basename(path))[0])
    section = {"file": os.path.relpath(path, root), "title": dash["title"], "panels": []}
    for panel in dash["panels"]:
        if panel.get("type") == "row" or (which == "timeseries" and panel.get("type") != "timeseries"):
            continue
        queries, legend_lines = [], 0
        for t in panel.get("targets", []):
            if t.get("hide") or not t.get("expr"):
                continue
            expr = substitute(t["expr"])
            try:
                res = api("query_range", query=expr, start=start, end=end, step=step)["result"]
            except Exception as e:  # noqa: BLE001 - report every failing query, then fail
                failures.append(f"{dname} / {panel['title']} / {t.get('refId')}: {expr}: {e}")
                continue
            if not res and GPU_ONLY in panel.get("description", "") and not gpu_workers:
                skipped.append(f"{dname} / {panel['title']} / {t.get('refId')}")
                continue
            if not res:
                failures.append(f"{dname} / {panel['title']} / {t.get('refId')}: no series: {expr}")
                continue
            queries.append((t.get("refId", "?"), expr, len(res)))
            legend_lines += len(res)
        if not queries or len(queries) != len([t for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]):
            continue
        params = {}
        for i, (_, expr, _) in enumerate(queries):
            params.update({f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0",
                           f"g{i}.range_input": range_input, f"g{i}.end_input": end_input,
                           f"g{i}.step_input": str(step)})
        url = f"{prom}/graph?{urllib.parse.urlencode(params, quote_via=urllib.parse.quote)}"
        # Tall enough for every graph and its legend (one line per series, long PromQL wraps);
        # the white space left below is cropped.
        height = 200 + sum(800 + 40 * n + 30 * (len(e) // 80) for _, e, n in queries)
        png = os.path.join(out, f"{dname}-{slug(panel['title'])}.png")
        subprocess.run(chromium + [f"--window-size={width},{height}", f"--screenshot={png}", url],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        img = Image.open(png).convert("RGB")
        box = ImageChops.difference(img, Image.new("RGB", img.size, (255, 255, 255))).getbbox()
        if box and box[3] + 16 < img.size[1]:
            img = img.crop((0, 0, img.size[0], box[3] + 16))
        # 256 colours are plenty for a graph page and keep the files small.
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)
        total += os.path.getsize(png)
        print(f"  {os.path.relpath(png, root)}  {img.size[0]}x{img.size[1]}  {os.path.getsize(png) // 1024} KiB"
              f"  ({sum(n for *_, n in queries)} series)")
        section["panels"].append({"title": panel["title"], "type": panel.get("type"),
                                  "png": os.path.relpath(png, os.path.join(root, "docs")),
                                  "queries": [(r, e) for r, e, _ in queries]})
    gallery.append(section)

if failures:
    print("render-dashboards: queries that would show \"No data\" or an error:", file=sys.stderr)
    for f in failures:
        print("  " + f, file=sys.stderr)
    sys.exit(1)
for s in skipped:
    print(f"render-dashboards: skipped {s}: no series, no worker computed on a GPU in this data")
print(f"render-dashboards: {sum(len(s['panels']) for s in gallery)} pictures, {total // 1024} KiB in {os.path.relpath(out, root)}")

if markdown:  # per dashboard, a list: each panel's picture and the PromQL it shows
    lines = []
    for s in gallery:
        lines += [f"#### {s['title']} (`{s['file']}`)", ""]
        for p in s["panels"]:
            kind = "" if p["type"] == "timeseries" else f" ({p['type']} panel, here over time)"
            item = f"- [**{p['title']}**]({p['png']}){kind}:"
            if len(p["queries"]) == 1:
                lines.append(f"{item} `{p['queries'][0][1]}`")
            else:
                lines.append(item)
                lines += [f"  - {r}: `{e}`" for r, e in p["queries"]]
        lines.append("")
    with open(markdown, "w") as f:
        f.write("\n".join(lines))
    print(f"render-dashboards: gallery in {markdown}")
PY
