"""mgx_graph.llm.sampling's rule (the one the gpu kernels implement) against references written here: a
plain-Python Philox4x32-10 checked on Random123's known-answer vectors, a sort-based numpy version of
transformers' processors (and transformers' own processors where installed) for the kept set, and
chi-square tests of many seeded draws against the renormalized probabilities."""
import numpy as np
import pytest

from mgx_graph.errors import ParameterError
from mgx_graph.llm.sampling import SamplingConfig, TokenSampler, kept, philox4x32, process_logits, uniforms

# Random123 1.14, examples/kat_vectors: philox4x32 10 rounds (counter, key, output)
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


def _philox_plain(ctr, key):
    """Philox4x32-10 with Python ints (Salmon et al., SC'11)."""
    c, k = list(ctr), list(key)
    mask = 0xFFFFFFFF
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & mask, (k[1] + 0xBB67AE85) & mask]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & mask, (p0 >> 32) ^ c[3] ^ k[1], p0 & mask]
    return tuple(c)


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert _philox_plain(ctr, key) == want
    assert tuple(int(w) for w in philox4x32(np.array(ctr, np.uint64), key)) == want


def test_uniforms_are_philox_word_zero_of_seed_step_row():
    for seed, step in [(0, 0), (7, 3), (2**64 - 1, 2**40 + 5)]:
        got = uniforms(seed, step, 5)
        for r in range(5):
            x0 = _philox_plain((step & 0xFFFFFFFF, step >> 32, r, 0), (seed & 0xFFFFFFFF, seed >> 32))[0]
            assert got[r] == (x0 >> 8) / 2**24


# -- the kept set --------------------------------------------------------------------------------------
def _sorted_reference(s, cfg):
    """Kept mask of one row by transformers' processors written with a sort (float64 probabilities)."""
    s = s.astype(np.float64)
    keep = np.ones(len(s), bool)
    k = cfg.get("top_k", 50)
    if k and k < len(s):
        keep &= s >= np.sort(s)[::-1][k - 1]
    p = cfg.get("top_p", 1.0)
    if p < 1.0:
        x = np.where(keep, s, -np.inf)
        pr = np.exp(x - x.max())
        pr /= pr.sum()
        order = np.argsort(x, kind="stable")  # ascending, as TopPLogitsWarper
        cum = np.cumsum(pr[order])
        drop = cum <= 1 - p
        drop[-1] = False
        keep[order[drop]] = False
    if cfg.get("min_p") is not None:
        x = np.where(keep, s, -np.inf)
        pr = np.exp(x - x.max())
        keep &= ~(pr < cfg["min_p"] * pr.max())
    return keep


CONFIGS = [dict(temperature=0.7, top_p=0.9), dict(top_k=50, top_p=0.9, temperature=0.7), dict(top_k=5),
           dict(top_k=None, top_p=0.5), dict(top_k=None, min_p=0.05), dict(top_k=200, top_p=0.95, min_p=0.1),
           dict(top_k=1), dict(top_k=None, top_p=0.999), dict(top_k=None, temperature=1.3)]


def _cfg_id(c):
    return ",".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_kept_set_equals_the_sorted_reference(cfg):
    rng = np.random.default_rng(1)
    config = SamplingConfig(do_sample=True, **cfg)
    for scale, v in [(1.0, 300), (3.0, 1000), (8.0, 5000)]:
        s = (rng.standard_normal((20, v)) * scale).astype(np.float32)
        got = kept(s, config)
        for r in range(len(s)):
            np.testing.assert_array_equal(got[r], _sorted_reference(s[r], cfg), err_msg=f"row {r} scale {scale}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_kept_set_equals_transformers_processors(cfg):
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    chain = []
    if cfg.get("top_k", 50):
        chain.append(lp.TopKLogitsWarper(cfg.get("top_k", 50)))
    if cfg.get("top_p", 1.0) < 1.0:
        chain.append(lp.TopPLogitsWarper(cfg["top_p"]))
    if cfg.get("min_p") is not None:
        chain.append(lp.MinPLogitsWarper(cfg["min_p"]))
    s = (np.random.default_rng(2).standard_normal((16, 700)) * 4).astype(np.float32)
    want = torch.from_numpy(s.copy())
    for proc in chain:
        want = proc(None, want)
    np.testing.assert_array_equal(kept(s, SamplingConfig(do_sample=True, **cfg)), np.isfinite(want.numpy()))


def test_ties_at_a_boundary_are_kept_together():
    s = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0]], np.float32)
    assert kept(s, SamplingConfig(do_sample=True, top_k=2)).tolist() == [[True, True, True, True, False, False]]
    # e of 5.0 is 1, of each 3.0 is 0.135: mass above a 3.0 is 1 < 0.8 * Z -> all three 3.0 stay
    got = kept(s, SamplingConfig(do_sample=True, top_k=None, top_p=0.8))
    assert got.tolist() == [[True, True, True, True, False, False]]


def test_repetition_penalty_and_temperature_are_applied_first():
    s = np.array([[2.0, -1.0, 0.5, 3.0]], np.float32)
    seen = np.array([[True, True, False, False]])
    out = process_logits(s, seen, SamplingConfig(do_sample=True, top_k=None, repetition_penalty=2.0, temperature=0.5))
    np.testing.assert_allclose(out, [[2.0, -4.0, 1.0, 6.0]])
    greedy = process_logits(s, seen, SamplingConfig(repetition_penalty=4.0))
    np.testing.assert_allclose(greedy, [[0.5, -4.0, 0.5, 3.0]])


# -- draws ---------------------------------------------------------------------------------------------
def _draws(logits, cfg, seed, n, seen_tokens=()):
    sampler = TokenSampler(SamplingConfig(do_sample=True, seed=seed, **cfg), 1, logits.shape[-1])
    sampler.observe(0, seen_tokens)
    return np.array([sampler.choose(logits)[0] for _ in range(n)])


@pytest.mark.parametrize("cfg", CONFIGS[:6], ids=_cfg_id)
def test_draws_follow_the_renormalized_probabilities(cfg):
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((1, 400)) * 2.5).astype(np.float32)
    s = logits[0].astype(np.float64) / cfg.get("temperature", 1.0)
    keep = _sorted_reference(s.astype(np.float32), cfg)
    p = np.where(keep, np.exp(s - s.max()), 0.0)
    p /= p.sum()
    n = 6000
    got = _draws(logits, cfg, seed=12345, n=n)
    assert keep[got].all()  # never a dropped token
    counts = np.bincount(got, minlength=len(p))
    big = p * n >= 5  # chi-square over the cells with >= 5 expected, the rest pooled
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * n, p[~big].sum() * n)
    obs, exp = obs[exp > 0], exp[exp > 0]
    df = max(len(obs) - 1, 1)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df)  # ~4 sigma of the chi-square law


def test_the_same_seed_gives_the_same_tokens():
    logits = (np.random.default_rng(4).standard_normal((1, 500)) * 2).astype(np.float32)
    cfg = dict(temperature=0.7, top_p=0.9)
    a, b = _draws(logits, cfg, 99, 50), _draws(logits, cfg, 99, 50)
    assert a.tolist() == b.tolist()
    assert _draws(logits, cfg, 100, 50).tolist() != a.tolist()


def test_rows_draw_independently_at_each_step():
    logits = np.zeros((3, 1000), np.float32)
    sampler = TokenSampler(SamplingConfig(do_sample=True, top_k=None, seed=5), 3, 1000)
    picks = np.array([sampler.choose(logits) for _ in range(8)])  # uniform over 1000: distinct rows / steps
    assert len(set(picks.ravel().tolist())) > 20
    assert sampler.step == 8


def test_repetition_penalty_lowers_a_seen_tokens_share():
    logits = np.array([[2.0, 2.0, 0.0, 0.0]], np.float32)
    cfg = dict(top_k=None, repetition_penalty=3.0)
    got = _draws(logits, cfg, 8, 3000, seen_tokens=[0])
    share0, share1 = np.mean(got == 0), np.mean(got == 1)
    e = np.exp([2 / 3, 2.0, 0.0, 0.0])
    want0 = e[0] / e.sum()
    assert abs(share0 - want0) < 4 * np.sqrt(want0 * (1 - want0) / 3000)
    assert share0 < share1


# -- bad options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, limit", [(dict(temperature=0), "(0"), (dict(temperature=-1.0), "(0"),
                                        (dict(top_p=0.0), "(0, 1]"), (dict(top_p=1.5), "(0, 1]"),
                                        (dict(min_p=1.5), "[0, 1]"), (dict(repetition_penalty=0), "(0"),
                                        (dict(top_k=-1), "non-negative"), (dict(seed=-1), "non-negative"),
                                        (dict(seed=2**64), "2**64 - 1")])
def test_out_of_range_options_name_the_value_and_the_limit(bad, limit):
    name, value = next(iter(bad.items()))
    with pytest.raises(ParameterError) as e:
        SamplingConfig(do_sample=True, **bad)
    assert name in str(e.value) and limit in str(e.value) and repr(value) in str(e.value)
