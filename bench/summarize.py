#!/usr/bin/env python3
"""Turns compare.sh's JSON lines (one per `haven bench --json` run) into a markdown table:
medians per scenario and broker, ratios to ActiveMQ, peak RSS, and issue 9's targets.
Scenario (e), the backlog, gets a table of its own: its lines carry a fill and a drain."""
import argparse, json, platform, os, statistics, time

SCENARIOS = {
    "a": "1 producer/1 consumer, persistent, RECEIPT per SEND",
    "a0": "(a) without the disk: 1/1 non-persistent, RECEIPT per SEND (no target; what a RECEIPT's "
          "round trip costs besides the sync)",
    "b": "1/1 persistent, RECEIPT every 100",
    "c": "4/4 persistent, RECEIPT every 100",
    "d": "1/1 non-persistent, RECEIPT every 100",
    "e": "backlog of {n} messages: filled by 1 producer (persistent, RECEIPT every 100) with no "
         "consumer attached, then drained by 1 consumer",
    "f": "(b) with 64 KiB bodies: 1/1 persistent, RECEIPT every 100",
    "g": "100 queues, each with its own producer and consumer (100/100), persistent, RECEIPT every 100",
}
# Issue 9: throughput ratio to ActiveMQ in the same run.
TARGET_RATIO = {"a": 1.5, "b": 4.0, "c": 3.0, "d": 2.5}
# Issue 9: throughput ratio to RabbitMQ's quorum queues in the same run.
TARGET_RATIO_RABBIT_QUORUM = {"b": 4.0, "c": 4.0}
# Issue 9: Haven's peak RSS at most this share of ActiveMQ's, scenario by scenario.
TARGET_RSS_SHARE = 0.25
# Issue 9, (e): Haven's drain rate within 20% of its own (b) rate in the same run, and issue 3's
# memory bound held while the backlog is filled and drained.
BACKLOG_DRAIN_VS_B = 0.8
BACKLOG_RSS_MIB_MAX = 512

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
    runs, probes = [], []
    for line in open(a.jsonl):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        if d.get("kind") == "fsync":
            probes.append(d)
        else:
            runs.append(d)
    fsync = disk(probes)
    brokers = sorted({r["broker"] for r in runs}, key=lambda b: (b != "haven", b))
    scenarios = [s for s in SCENARIOS if s != "e" and any(r["scenario"] == s for r in runs)]
    backlog = [r for r in runs if r["scenario"] == "e"]
    out = []
    out.append(f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} at commit `{a.commit}` on "
               f"{os.cpu_count()} cores, Linux {platform.release()}, with `{a.command}` "
               f"(load average at the end: {os.getloadavg()[0]:.1f}; other work on the machine skews results).")
    out.append("")
    if fsync:
        l = fsync["latency_us"]
        each = ""
        if len(probes) > 1:
            each = (f" Medians of {len(probes)} probes (one at the start, one before each repetition "
                    f"of (a)); each probe's p99: {', '.join(fmt(p['latency_us']['p99']) for p in probes)} us.")
        out.append(f"Disk `fdatasync` ({fsync['count']} x {fsync['bytes']} B writes, preallocated file): "
                   f"**{fmt(fsync['rate'])}/s**, p50 {fmt(l['p50'])} us, p99 {fmt(l['p99'])} us, max {fmt(l['max'])} us.{each}")
        out.append("")
    if scenarios:
        out.extend(main_table(scenarios, brokers, runs, fsync))
    if backlog:
        if scenarios:
            out.append("")
        out.extend(backlog_table(backlog, brokers, runs))
    print("\n".join(out))

def disk(probes):
    """The disk's figures over the run's `fdatasync` probes: the median of each (max: the
    largest), so that (a)'s bound follows the disk over the whole run, not one moment of it."""
    if not probes:
        return None
    d = dict(probes[0])
    d["rate"] = med([p["rate"] for p in probes])
    d["latency_us"] = {k: med([p["latency_us"][k] for p in probes]) for k in ("p50", "p99")}
    d["latency_us"]["max"] = max(p["latency_us"]["max"] for p in probes)
    return d

def main_table(scenarios, brokers, runs, fsync):
    """The duration-based scenarios: one row per scenario and broker."""
    out = []
    out.append("| scenario | broker | msg/s (median) | vs ActiveMQ | target | sent msg/s | send→receipt p50 / p99 (ms) "
               "| send→receive p50 / p99 (ms) | peak RSS (MiB) | runs ok |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    all_by = {}
    for s in scenarios:
        by = all_by[s] = {}
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
            out.extend(round_trip_floor(runs, brokers, fsync))
    out.extend(other_targets(all_by, brokers))
    return out

def round_trip_floor(runs, brokers, fsync):
    """(a) read against its parts: the disk's p99 sync plus each broker's p99 round trip without
    the disk, (a0), measured in the same run. A RECEIPT per SEND pays both, so their sum is
    about what the p99 of (a) can reach on this machine; the bound (twice the sync) leaves the
    round trip only one sync's worth."""
    out = []
    disk_p99 = fsync["latency_us"]["p99"]
    for b in brokers:
        p99 = {s: med([lat(r, "receipt_latency_us", "p99") for r in runs
                       if r["scenario"] == s and r["broker"] == b and r.get("ok")]) for s in ("a", "a0")}
        if p99["a"] is None or p99["a0"] is None:
            continue
        floor = disk_p99 + p99["a0"]
        out.append(f"- {b}: (a) p99 {fmt(p99['a'])} us; its round trip without the disk, (a0), p99 "
                   f"{fmt(p99['a0'])} us; disk p99 + (a0) p99 = {fmt(floor)} us ({fmt(p99['a'] / floor, 2)}×).")
    if out:
        out.insert(0, "")
        out.insert(1, "(a)'s parts (not a target): every RECEIPT of (a) waits for one sync and one round "
                      "trip between client and broker.")
    return out

def other_targets(all_by, brokers):
    """Issue 9's targets that are not a column of the table: (b) and (c) against RabbitMQ's
    quorum queues, and Haven's peak RSS against ActiveMQ's, the worst scenario deciding."""
    out = []
    rq = "rabbitmq-quorum"
    if "haven" in brokers and rq in brokers:
        for s, target in TARGET_RATIO_RABBIT_QUORUM.items():
            h, r = (all_by.get(s, {}).get(b, {}).get("rate") for b in ("haven", rq))
            if h and r:
                ratio = h / r
                out.append("")
                out.append(f"({s}) target ≥ {target}× RabbitMQ quorum queues: Haven {fmt(h)} against "
                           f"{fmt(r)} msg/s, {fmt(ratio, 1)}× → {'met' if ratio >= target else '**missed**'}.")
    if "haven" in brokers and "activemq" in brokers:
        shares = []
        for s, by in all_by.items():
            h, a = by["haven"]["rss"], by["activemq"]["rss"]
            if h and a:
                shares.append((h / a, s, h, a))
        if shares:
            share, s, h, a = max(shares)
            out.append("")
            out.append(f"Peak RSS target ≤ {TARGET_RSS_SHARE:g}× ActiveMQ's in every scenario: the highest share is "
                       f"({s}), Haven {fmt(h)} against {fmt(a)} MiB, {fmt(share, 2)}× → "
                       f"{'met' if share <= TARGET_RSS_SHARE else '**missed**'}.")
    return out

def backlog_table(backlog, brokers, runs):
    """Scenario (e): drain rate (the main figure), fill rate, peak RSS per phase, targets."""
    out = []
    ns = sorted({r.get("count") for r in backlog if r.get("count")})
    n_text = " / ".join(f"{n:,}" for n in ns) or "n/a"
    out.append(f"Scenario (e), {SCENARIOS['e'].format(n=n_text)}:")
    out.append("")
    out.append("| broker | drain msg/s (median) | vs ActiveMQ | drain vs own (b) | target | fill msg/s (median) "
               "| fill / drain time (s) | peak RSS fill / drain (MiB) | runs ok |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    mib = lambda k: k / 1024 if k else None
    by = {}
    for b in brokers:
        rs = [r for r in backlog if r["broker"] == b]
        if not rs:
            continue
        good = [r for r in rs if r.get("ok")]
        b_runs = [r for r in runs if r["scenario"] == "b" and r["broker"] == b and r.get("ok")]
        by[b] = dict(
            n=len(rs), ok=len(good),
            drain=med([r.get("recv_rate") for r in good]),
            fill=med([(r.get("fill") or {}).get("send_rate") for r in good]),
            fill_s=med([(r.get("fill") or {}).get("send_seconds") for r in good]),
            drain_s=med([r.get("recv_seconds") for r in good]),
            b_rate=med([r.get("recv_rate") for r in b_runs]),
            rss_fill=max([r.get("rss_fill_kib", 0) for r in rs] or [0]),
            rss_drain=max([r.get("rss_drain_kib", 0) for r in rs] or [0]),
        )
    base = by.get("activemq", {}).get("drain")
    verdicts = []
    for b, v in by.items():
        ratio = v["drain"] / base if (base and v["drain"] and b != "activemq") else None
        vs_b = v["drain"] / v["b_rate"] if (v["drain"] and v["b_rate"]) else None
        verdict = ""
        if b == "haven" and vs_b is not None:
            verdict = f"≥{BACKLOG_DRAIN_VS_B}× (b) {'met' if vs_b >= BACKLOG_DRAIN_VS_B else '**missed**'}"
        out.append(f"| {b} | {fmt(v['drain'])} | {fmt(ratio, 2) + '×' if ratio else ''} "
                   f"| {fmt(vs_b, 2) + '×' if vs_b else 'n/a'} | {verdict} | {fmt(v['fill'])} "
                   f"| {fmt(v['fill_s'], 1)} / {fmt(v['drain_s'], 1)} "
                   f"| {fmt(mib(v['rss_fill']))} / {fmt(mib(v['rss_drain']))} | {v['ok']}/{v['n']} |")
        if b == "haven":
            if vs_b is None and v["ok"]:
                verdicts.append(f"(e) target drain ≥ {BACKLOG_DRAIN_VS_B}× (b): not checked, (b) was not measured "
                                "for Haven in this run (add `b` to --scenarios).")
            peak = mib(max(v["rss_fill"], v["rss_drain"]))
            if not v["ok"]:
                verdicts.append("(e) targets: not checked, no run of Haven completed.")
            elif peak:
                verdicts.append(f"(e) target peak RSS ≤ {BACKLOG_RSS_MIB_MAX} MiB (issue 3's bound) "
                                f"during fill and drain: Haven {fmt(peak)} MiB → "
                                f"{'met' if peak <= BACKLOG_RSS_MIB_MAX else '**missed**'}.")
    out.append("")
    out.append("Drain msg/s: messages / (drain start → last delivery), with ack auto and the broker's "
               "default prefetch, as in (b); fill msg/s: messages / (first send → last RECEIPT). "
               "Drain vs own (b): the drain rate over the same broker's (b) msg/s median in this run "
               "(issue 9: within 20%). Peak RSS is the broker's VmHWM, reset before each phase, "
               "largest over the runs. A run is ok when every message of the fill was receipted "
               "and the drain delivered each exactly once.")
    if verdicts:
        out.append("")
        out.extend(verdicts)
    return out

if __name__ == "__main__":
    main()
