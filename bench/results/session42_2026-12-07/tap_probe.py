"""Which target layers carry the drafter's first draft? An MLP probe (session 42, CPU): from the tapped target layers
at position p - 1 and the embedding of x_p (what a DFlash drafter's first position and an MTP layer see), predict the
target's greedy token after x_p; top-1 on held-out text. Tap 5 of the 6-layer tiny target is its final-normed output
(HF hidden_states[6]). Not a drafter: no attention over the context, a few minutes of training each.

    python3 bench/results/session42_2026-12-07/tap_probe.py
"""
import sys, json, time, torch, torch.nn.functional as F
sys.argv = ['x']; sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3] / 'tools'))
import train_dflash as T, train_tiny
from tokenizers import Tokenizer
torch.set_num_threads(2); torch.manual_seed(0)
tok = Tokenizer.from_file(str(T.REPO / 'models/tiny-glm/tokenizer.json'))
docs = train_tiny.corpus_documents()
tr, va = train_tiny.token_streams(tok, docs, 1234)
tgt = T.Target(T.REPO / 'models/tiny-glm', [0, 1, 2, 3, 4, 5], torch.device('cpu'))
gen = torch.Generator().manual_seed(1)
def feats(stream, n):
    w = train_tiny.random_windows(stream, gen, n, 128)
    outs = [tgt.tapped(w[i:i + 16], want_greedy=True) for i in range(0, n, 16)]
    taps = torch.cat([o[0] for o in outs]); greedy = torch.cat([o[1] for o in outs])
    return (w, greedy), taps
t0 = time.time()
wtr, ftr = feats(tr, 2048); wva, fva = feats(va, 64)
print('features', time.time() - t0, flush=True)
H = 256
def data(wg, f, taps):
    w, g = wg
    # predict x_{p+1} from taps at p-1 and embed(x_p): the drafter's first position, MTP's inputs
    x_prev = torch.cat([f[:, :-2, i * H:(i + 1) * H] for i in taps], -1)
    e = tgt.embed(w[:, 1:-1])
    y = g[:, 1:-1]  # the target's greedy token after x_p: what the drafter's first draft must equal
    return torch.cat([x_prev, e], -1).reshape(-1, len(taps) * H + H), y.reshape(-1)
for taps in ([1, 3], [5], [3], [4]):
    X, Y = data(wtr, ftr, taps); Xv, Yv = data(wva, fva, taps)
    X, Xv = X.detach(), Xv.detach()
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 768), torch.nn.SiLU(), torch.nn.Linear(768, H))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for step in range(2500):
        idx = torch.randint(0, X.shape[0], (1024,))
        logits = tgt.lm_head(net(X[idx]))
        loss = F.cross_entropy(logits, Y[idx])
        opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        acc = (tgt.lm_head(net(Xv)).argmax(-1) == Yv).float().mean().item()
        acc_tr = (tgt.lm_head(net(X[:20000])).argmax(-1) == Y[:20000]).float().mean().item()
    print(f'taps {taps} (5 = final-normed): next-next token top-1 val {acc:.3f} train {acc_tr:.3f}  ({time.time() - t0:.0f} s)', flush=True)
