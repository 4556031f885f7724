"""OpenEnv's WebSocket endpoint as OpenEnv serves it (FastAPI on uvicorn, Debian's python3-fastapi
and python3-uvicorn), for tests/rl/test_openenv.c: the message loop of OpenEnv's
src/openenv/core/env_server/http_server.py (websocket_endpoint: receive_text, json, match on
"type", reply with model_dump_json of WSObservationResponse or WSErrorResponse, break on
"close", close the socket) around a small environment (guess the item's answer, as
openenv_server.py's game). uvicorn pings every 0.5 s and drops a client that has not answered
within 0.5 s: a client that leaves its socket unserviced between steps loses its session.

Run: python3 openenv_uvicorn.py  (prints the port it listens on, on 127.0.0.1, as its first
line; exits 77 when fastapi or uvicorn is missing)
"""
import json
import socket
import sys

try:
    import uvicorn
    from fastapi import FastAPI, WebSocket, WebSocketDisconnect
except ImportError:
    sys.exit(77)

app = FastAPI()


@app.websocket("/ws")
async def websocket_endpoint(websocket: WebSocket):
    await websocket.accept()
    state = {}
    try:
        while True:
            message = json.loads(await websocket.receive_text())
            kind, data = message.get("type"), message.get("data") or {}
            if kind == "close":
                break
            if kind == "reset":
                state = {"answer": str(data["item"]["answer"]), "steps": 0}
                obs = {"text": "guess", "host": websocket.headers.get("host")}
                reply = {"observation": obs, "reward": None, "done": False}
            elif kind == "step" and state:
                state["steps"] += 1
                hit = data.get("message", "")[:1] == state["answer"]
                reply = {"observation": {"text": "right" if hit else "no",
                                         "steps": state["steps"]},
                         "reward": 1.0 if hit else 0.0, "done": hit}
            else:
                await websocket.send_text(json.dumps({"type": "error", "data": {
                    "message": "Unknown message type: %s" % kind, "code": "UNKNOWN_TYPE"}}))
                continue
            await websocket.send_text(json.dumps({"type": "observation", "data": reply}))
    except WebSocketDisconnect:
        pass
    finally:
        try:
            await websocket.close()
        except RuntimeError:
            pass


def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, ws_ping_interval=0.5, ws_ping_timeout=0.5, log_level="error")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
