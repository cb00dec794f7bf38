#!/usr/bin/env python3
"""device: kiln serve on CUDA with TP ranks + drafting, concurrent greedy requests, texts equal to TP=1 plain."""
import json, os, subprocess, sys, threading, time, urllib.request
OUT = os.environ["OUT"]
PROMPTS = [f"def function_{i}(x):\n    \"\"\"Return the {w} of x" for i, w in enumerate(
    ["square", "list", "string", "sum", "length", "first item", "reversed copy", "hash", "type", "name",
     "absolute value", "next element"])]

def serve(name, sets, port, recipe="configs/tiny-cpu.toml"):
    log = open(f"{OUT}/serve_{name}.log", "w")
    cmd = ["build/bin/kiln", "serve", recipe, "--port", str(port), "--set", "model.device=cuda"]
    for s in sets: cmd += ["--set", s]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
        except Exception:
            time.sleep(0.5)
    res = [None] * len(PROMPTS)
    def one(i):
        body = json.dumps({"model": "tiny-glm", "prompt": PROMPTS[i], "max_tokens": 48, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            res[i] = json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["text"]
        except Exception as e:
            res[i] = f"ERROR {e}"
    for rnd in range(2):  # all at once (batched), twice
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        [t.start() for t in ts]; [t.join() for t in ts]
        if rnd == 0: first = list(res)
    p.send_signal(2)
    try: p.wait(30)
    except Exception: p.kill()
    return first, res

if os.environ.get("CASES") == "cause":
    for port, (name, sets) in enumerate([("default", []), ("noprefix", ["scheduler.prefix_caching=false"]),
                                         ("seq1", ["scheduler.max_num_seqs=1"]),
                                         ("seq1_noprefix", ["scheduler.max_num_seqs=1", "scheduler.prefix_caching=false"])], 18200):
        a, b = serve(name, sets, port)
        print(name, "rounds equal:", a == b, "; differing prompts:", [i for i in range(len(a)) if a[i] != b[i]])
        if name == "default": ref = a
        else: print("   round 1 vs default round 1 differing:", [i for i in range(len(a)) if a[i] != ref[i]])
    sys.exit(0)
base_first, base = serve("tp1", [], 18100)
ok = True
cases = [("tp1_mtp3", ["speculative.method=mtp", "speculative.depth=3"]),
         ("tp2", ["parallel.tensor=2", 'transport.backend="socket"']),
         ("tp2_mtp3", ["parallel.tensor=2", 'transport.backend="socket"', "speculative.method=mtp", "speculative.depth=3"]),
         ("tp3_mtp5", ["parallel.tensor=3", 'transport.backend="socket"', "speculative.method=mtp", "speculative.depth=5"]),
         ("tp2_dflash2", ["parallel.tensor=2", 'transport.backend="socket"'], "configs/tiny-cpu-dflash2.toml"),
         ("tp1_dflash2", [], "configs/tiny-cpu-dflash2.toml")]
print("tp1 repeat equal:", base_first == base)
for port, case in enumerate(cases, 18101):
    name, sets = case[0], case[1]
    a, b = serve(name, sets, port, *case[2:])
    same = [x == y for x, y in zip(base, a)] + [x == y for x, y in zip(base, b)]
    print(f"{name}: {sum(same)}/{len(same)} equal to TP=1 plain")
    if not all(same):
        ok = False
        for i, (x, y) in enumerate(zip(base, a)):
            if x != y: print(f"  [{i}] want {x!r}\n      got  {y!r}")
json.dump({"base": base}, open(f"{OUT}/serve_tp_texts.json", "w"), indent=1)
print("ALL EQUAL" if ok else "DIFFERENCES")
