"""The providers' batch endpoints (OpenAI's Batch API, Anthropic's Message Batches): the
same rows a live run sends, split into submissions, each journaled as it is uploaded,
submitted, polled and collected, and every row's answer made into the Result a live run
would have given it, each part priced and reserved under the live lane's spend cap.

May import: core, limits, http, store.
"""
