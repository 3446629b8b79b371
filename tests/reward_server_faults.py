"""A misbehaving reward server for the fault tests: a real HTTP server (FastAPI under uvicorn) that
speaks the /score protocol of `mmrl serve-reward` and fails as its MODE says:

- ``hang``: never answers /score;
- ``error500``: answers every /score with HTTP 500;
- ``wrong_length``: answers one value fewer than the rows;
- ``nan``: answers NaN for every row;
- ``die_after:N``: scores digit_share (tests/digit_reward.py) like `mmrl serve-reward digit_share`
  for N requests, then kills its own process (SIGKILL) on the next one.

Run as ``python tests/reward_server_faults.py MODE PORT``; it counts the /score requests it got at
GET /count.
"""

import os
import signal
import sys
import time

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import Response

app = FastAPI()
seen = {"score": 0}


def digit_share(completions):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


@app.get("/health")
def health():
    return {"status": "ok"}


@app.get("/count")
def count():
    return seen


@app.post("/score")
def score(request: dict):
    seen["score"] += 1
    mode = sys.argv[1]
    completions = request["completions"]
    if mode == "hang":
        time.sleep(3600)
    if mode == "error500":
        raise HTTPException(500, "the reward model ran out of memory")
    if mode == "wrong_length":
        return {"rewards": [0.5] * (len(completions) - 1)}
    if mode == "nan":
        return Response('{"rewards": [' + ", ".join(["NaN"] * len(completions)) + "]}",
                        media_type="application/json")
    if mode.startswith("die_after:") and seen["score"] > int(mode.split(":")[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"rewards": digit_share(completions), "metrics": {}}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
