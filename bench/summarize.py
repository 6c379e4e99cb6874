#!/usr/bin/env python3
"""Turns compare.sh's JSON lines (one per `haven bench --json` run) into a markdown table:
medians per scenario and broker, ratios to ActiveMQ, peak RSS, and issue 9's targets."""
import argparse, json, platform, os, statistics, time

SCENARIOS = {
    "a": "1 producer/1 consumer, persistent, RECEIPT per SEND",
    "b": "1/1 persistent, RECEIPT every 100",
    "c": "4/4 persistent, RECEIPT every 100",
    "d": "1/1 non-persistent, RECEIPT every 100",
}
# Issue 9: throughput ratio to ActiveMQ in the same run.
TARGET_RATIO = {"a": 1.5, "b": 4.0, "c": 3.0, "d": 2.5}

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def lat(run, key, q):
    v = run.get(key) or {}
    return v.get(q)

def fmt(x, nd=0):
    if x is None:
        return "n/a"
    return f"{x:,.{nd}f}"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--command", default="bench/compare.sh")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    runs, fsync = [], None
    for line in open(a.jsonl):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        if d.get("kind") == "fsync":
            fsync = d
        else:
            runs.append(d)
    brokers = sorted({r["broker"] for r in runs}, key=lambda b: (b != "haven", b))
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in runs)]
    out = []
    out.append(f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} at commit `{a.commit}` on "
               f"{os.cpu_count()} cores, Linux {platform.release()}, with `{a.command}` "
               f"(load average at the end: {os.getloadavg()[0]:.1f}; other work on the machine skews results).")
    out.append("")
    if fsync:
        l = fsync["latency_us"]
        out.append(f"Disk `fdatasync` ({fsync['count']} x {fsync['bytes']} B writes, preallocated file): "
                   f"**{fmt(fsync['rate'])}/s**, p50 {fmt(l['p50'])} us, p99 {fmt(l['p99'])} us, max {fmt(l['max'])} us.")
        out.append("")
    out.append("| scenario | broker | msg/s (median) | vs ActiveMQ | target | sent msg/s | send→receipt p50 / p99 (ms) "
               "| send→receive p50 / p99 (ms) | peak RSS (MiB) | runs ok |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in scenarios:
        by = {}
        for b in brokers:
            rs = [r for r in runs if r["scenario"] == s and r["broker"] == b]
            good = [r for r in rs if r.get("ok")]
            by[b] = dict(
                n=len(rs), ok=len(good),
                rate=med([r.get("recv_rate") for r in good]),
                srate=med([r.get("send_rate") for r in good]),
                rp50=med([lat(r, "receipt_latency_us", "p50") for r in good]),
                rp99=med([lat(r, "receipt_latency_us", "p99") for r in good]),
                ep50=med([lat(r, "latency_us", "p50") for r in good]),
                ep99=med([lat(r, "latency_us", "p99") for r in good]),
                rss=max([r.get("rss_kib", 0) for r in rs] or [0]) / 1024,
            )
        base = by.get("activemq", {}).get("rate")
        for b in brokers:
            v = by[b]
            ratio = v["rate"] / base if (base and v["rate"] and b != "activemq") else None
            target = TARGET_RATIO.get(s) if b == "haven" else None
            verdict = ""
            if target and ratio is not None:
                verdict = f"≥{target}× {'met' if ratio >= target else '**missed**'}"
            ms = lambda x: fmt(x / 1000 if x is not None else None, 2)
            out.append(f"| ({s}) | {b} | {fmt(v['rate'])} | {fmt(ratio, 2) + '×' if ratio else ''} | {verdict} | {fmt(v['srate'])} "
                       f"| {ms(v['rp50'])} / {ms(v['rp99'])} | {ms(v['ep50'])} / {ms(v['ep99'])} "
                       f"| {fmt(v['rss'])} | {v['ok']}/{v['n']} |")
    out.append("")
    for s in scenarios:
        out.append(f"- ({s}) {SCENARIOS[s]}")
    out.append("")
    out.append("msg/s is end to end: measured messages / (first measured send → last receive); "
               "sent msg/s is until the last RECEIPT (higher than msg/s when the broker builds a backlog). "
               "Latencies are medians over runs of each run's percentile. Peak RSS is the largest "
               "VmHWM of the broker over the scenario's runs (reset before each run). A run is ok "
               "when every receipted message arrived exactly once.")
    if fsync and "haven" in brokers:
        ha = [r for r in runs if r["scenario"] == "a" and r["broker"] == "haven" and r.get("ok")]
        p99 = med([lat(r, "receipt_latency_us", "p99") for r in ha])
        if p99 is not None:
            limit = 2 * fsync["latency_us"]["p99"]
            out.append("")
            out.append(f"(a) target p99 send→receipt ≤ 2× disk p99 fdatasync = {fmt(limit)} us: "
                       f"Haven {fmt(p99)} us → {'met' if p99 <= limit else '**missed**'}.")
    print("\n".join(out))

if __name__ == "__main__":
    main()
