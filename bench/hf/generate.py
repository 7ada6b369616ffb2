#!/usr/bin/env python3
"""Loads a folder `train --export-hf` wrote with transformers and answers one
prompt with it, greedily, through the chat template the export carries.

    python3 bench/hf/generate.py EXPORT "PROMPT" [MAX_NEW_TOKENS]

The README's step 4; bench/hf/readme.sh runs it on a fine-tune of the tiny
test checkpoint. Needs torch and transformers.
"""
import sys

from transformers import AutoModelForCausalLM, AutoTokenizer

folder, prompt = sys.argv[1], sys.argv[2]
max_new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder).eval()
messages = [{"role": "user", "content": prompt}]
if tokenizer.chat_template:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
else:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
# No further than the model's context (the test checkpoint's is 64 positions).
context = getattr(model.config, "max_position_embeddings", None) or ids.shape[1] + max_new_tokens
max_new_tokens = max(1, min(max_new_tokens, context - ids.shape[1]))
reply = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
print(f"{type(model).__name__} from {folder}, {sum(p.numel() for p in model.parameters()):,} parameters")
print(tokenizer.decode(reply[0, ids.shape[1]:], skip_special_tokens=True))
