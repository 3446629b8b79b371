"""A small OpenAI-compatible chat server for the judge tests (a real HTTP server in a subprocess):
``python tests/openai_judge_app.py MODEL_DIR PORT`` serves the causal LM saved in MODEL_DIR on
``/v1/chat/completions`` (greedy; with ``logprobs`` the first answer token's ``top_logprobs`` from
the model's softmax) and ``/health``; with the environment variable JUDGE_TEST_KEY set, a chat
request without ``Authorization: Bearer <its value>`` is answered 401. It stands in for `transformers serve` where
that server cannot answer: its chat completions refuse ``logprobs`` / ``top_logprobs`` (the P(Yes)
parse), and it takes no API key.

``python tests/openai_judge_app.py ANSWERS.json PORT`` answers from a script instead of a model:
ANSWERS.json maps a request's user text (the filled template) to the answer's content, for the
answers a tiny random model never writes ("7/10", "<answer>Image 1 is better</answer>"); a text it
does not hold is answered HTTP 404."""

import json
import os
import sys

import uvicorn
from fastapi import FastAPI, Header, HTTPException

source, port = sys.argv[1], int(sys.argv[2])
app = FastAPI()
if source.endswith(".json"):
    with open(source) as f:
        script = json.load(f)
else:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source).eval()


@app.get("/health")
def health():
    return {"status": "ok"}


def user_text(messages: list[dict]) -> str:
    content = messages[-1]["content"]
    return content if isinstance(content, str) else " ".join(p["text"] for p in content if p["type"] == "text")


def generated(body: dict) -> dict:
    """The model's greedy answer (and the first token's top log-probs when asked)."""
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
    return choice


@app.post("/v1/chat/completions")
def chat(body: dict, authorization: str | None = Header(default=None)):
    key = os.environ.get("JUDGE_TEST_KEY")
    if key and authorization != f"Bearer {key}":
        raise HTTPException(401, "a wrong or missing API key")
    if source.endswith(".json"):
        text = user_text(body["messages"])
        if text not in script:
            raise HTTPException(404, f"no scripted answer to {text[:80]!r}")
        choice = {"index": 0, "message": {"role": "assistant", "content": script[text]}, "finish_reason": "stop"}
    else:
        choice = generated(body)
    return {"id": "judge", "object": "chat.completion", "choices": [choice]}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
