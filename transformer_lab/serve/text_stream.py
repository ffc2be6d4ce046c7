"""TextStream: a request's generated token ids in, its text out, as a stream would show it.

    stream = TextStream(tokenizer, stop=["\\n\\n"])
    stream.push([token_id, ...])  # -> the text that became final ('' if none)
    stream.finish()               # -> what was held back; then stream.text is the whole text

Token bytes go through an incremental UTF-8 decoder, so a character split over
several tokens (Chinese, emoji: one token may hold half of one) comes out once it
is complete. Bytes that cannot start or continue a character become U+FFFD, as
tokenizer.decode makes them; a character cut off at the end (the token budget ran
out in the middle of it) is left out, as the chat CLI leaves it out. So the pieces
joined are tokenizer.decode(ids) less, at most, a U+FFFD at its end.

Stop strings (OpenAI's `stop`) end the text before their first occurrence, which is
not part of it. While text could still be the start of a stop string, the last
len(longest stop) - 1 characters are held back: a stop string split over tokens is
found whole and never half-shown.
"""
from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, tokenizer, stop=()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet shown
        self.text = ""  # everything shown so far
        self.stopped_by: str | None = None  # the stop string found, if any
        self.finished = False

    def push(self, token_ids) -> str:
        """Decode more tokens; the text that is final now ('' if none)."""
        if self.stopped_by is not None or self.finished:
            return ""
        for token in token_ids:
            self._pending += self._decoder.decode(self.tokenizer.token_bytes(token))
        return self._release(final=False)

    def finish(self) -> str:
        """The request ended: show what was held back. Bytes of a character that never
        completed are dropped, not shown as U+FFFD: only whole characters go out."""
        if self.stopped_by is not None or self.finished:
            self.finished = True
            return ""
        self._decoder.reset()
        self.finished = True
        return self._release(final=True)

    def _release(self, final) -> str:
        pending = self._pending
        found = [(i, s) for s in self.stop if (i := pending.find(s)) >= 0]
        if found:
            i, s = min(found)
            shown, self._pending, self.stopped_by = pending[:i], "", s
        else:
            cut = len(pending) if final else max(0, len(pending) - self._hold)
            shown, self._pending = pending[:cut], pending[cut:]
        self.text += shown
        return shown
