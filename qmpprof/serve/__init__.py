"""`qmpprof serve`'s HTTP side: request heads read from bytes within bounds (`http`),
the URL space (`routes`), the `vm` label added to a pprof (`labels`), all pure; and the
asyncio server that reads connections into them (`server`), which speaks no QMP.
`commands/serve.py` joins them to the recording pipeline."""
