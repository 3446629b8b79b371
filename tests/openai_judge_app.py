"""A small OpenAI-compatible chat server for the judge tests (a real HTTP server in a subprocess):
``python tests/openai_judge_app.py MODEL_DIR PORT`` serves the causal LM saved in MODEL_DIR on
``/v1/chat/completions`` (greedy; with ``logprobs`` the first answer token's ``top_logprobs`` from
the model's softmax) and ``/health``; with the environment variable JUDGE_TEST_KEY set, a chat
request without ``Authorization: Bearer <its value>`` is answered 401. It stands in for `transformers serve` where
that server cannot answer: its chat completions refuse ``logprobs`` / ``top_logprobs`` (the P(Yes)
parse), and it takes no API key."""

import os
import sys

import torch
import uvicorn
from fastapi import FastAPI, Header, HTTPException
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, port = sys.argv[1], int(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
app = FastAPI()


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/v1/chat/completions")
def chat(body: dict, authorization: str | None = Header(default=None)):
    key = os.environ.get("JUDGE_TEST_KEY")
    if key and authorization != f"Bearer {key}":
        raise HTTPException(401, "a wrong or missing API key")
    ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=body.get("max_tokens", 16), do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
    text = tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if body.get("logprobs"):
        logprobs = torch.log_softmax(out.scores[0][0].float(), -1)
        top = logprobs.topk(body.get("top_logprobs", 5))
        choice["logprobs"] = {"content": [{"token": tokenizer.decode([int(out.sequences[0, ids.shape[1]])]),
                                           "top_logprobs": [{"token": tokenizer.decode([int(i)]), "logprob": float(v)}
                                                            for v, i in zip(top.values, top.indices)]}]}
    return {"id": "judge", "object": "chat.completion", "choices": [choice]}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
