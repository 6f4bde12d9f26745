"""`autospec serve`: an OpenAI-compatible completions server on the engine and the online
controller, reporting to `autospec daemon`.

    openai.py   /v1/completions and /v1/chat/completions requests (validated), response shapes
    server.py   the aiohttp app: SSE streaming, controllers, telemetry and parameter pulls
    batcher.py  the one decode thread: continuous batching, the bounded wait queue (429)
"""
