"""Hugging Face models loaded with `device_map` (accelerate's dispatch: a layer offloaded to disk runs
with its weights moved in by an AlignDevicesHook at each forward) record and edit the same codes as
the model loaded whole (issue 26)."""

import numpy as np
import pytest
import torch

from latentcode.extraction import Recorder
from latentcode.intervention import Intervention, ZeroAblate

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=37, vocab_size=99, max_position_embeddings=32)


def test_a_layer_offloaded_to_disk_records_and_edits_the_same_codes(tmp_path):
    torch.manual_seed(0)
    whole = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, attn_implementation="sdpa")).eval()
    whole.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    mapped = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "model", device_map=device_map, offload_folder=tmp_path / "offload", attn_implementation="sdpa",
    ).eval()
    assert mapped.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # loaded at each forward
    inputs = torch.randint(0, 99, (3, 7), generator=torch.Generator().manual_seed(1))

    def recorded(model):
        with Recorder(model, "all-pairs:1") as recorder, torch.no_grad():
            model(input_ids=inputs)
        return recorder.pop()

    def edited(model):
        with Intervention(model, ZeroAblate(heads=[1]), sites="1:-1:*"), torch.no_grad():
            return model(input_ids=inputs).logits

    expected, got = recorded(whole), recorded(mapped)
    assert len(got) == 49 and all(np.array_equal(expected[site], got[site]) for site in expected)
    edited_whole = edited(whole)
    assert not torch.equal(edited_whole, whole(input_ids=inputs).logits)
    torch.testing.assert_close(edited(mapped), edited_whole, rtol=0, atol=0)
