"""onnxruntime-genai's own greedy decode: the oracle of the tests that run its model folders."""
from __future__ import annotations

import os


def og_greedy(model, prompt, max_new: int, cpu: bool = False) -> list[int]:
    """onnxruntime-genai's greedy tokens after ``prompt`` (at most ``max_new``; it stops at the model's
    end-of-sequence id). ``model``: an ``onnxruntime_genai.Model`` or a folder; ``cpu``: a folder is run
    on the CPU whatever provider its config names."""
    import onnxruntime_genai as og

    if isinstance(model, (str, os.PathLike)):
        if cpu:
            config = og.Config(str(model))
            config.clear_providers()
            model = og.Model(config)
        else:
            model = og.Model(str(model))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens([list(prompt)])
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out
