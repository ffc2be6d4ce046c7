"""A regex as an automaton over bytes: parse, Thompson NFA, subset construction, minimise.

    dfa = compile_regex(r"-?\\d+(\\.\\d+)?")
    dfa.accepts("3.14")            # True: the whole text must match (re.fullmatch)
    s = dfa.start
    for b in b"3.": s = dfa.step(s, b)
    dfa.is_accepting(s), s == dfa.dead   # False, False: "3." can still become a number

The language is exactly `re.fullmatch(pattern, text, re.ASCII)`'s for the syntax
below; re.ASCII only says that \\d \\w \\s mean [0-9], [A-Za-z0-9_] and [ \\t\\n\\r\\f\\v].

- literals, escapes (\\n \\t \\r \\f \\v \\a \\0 \\xhh \\uhhhh \\Uhhhhhhhh, an escaped
  non-letter stands for itself), `.` (any character but a newline);
- classes [a-z0-9_], negated [^...], with \\d \\w \\s \\D \\W \\S inside or outside;
- alternation |, groups ( ), (?: ), (?P<name> ), quantifiers * + ? {m} {m,n} {m,} {,n}
  (a lazy one, *?, matches the same language); a `{` that is not a quantifier is a
  literal, as in `re`;
- `^` as the first character and `$` as the last: a full match implies both.

Anything else (backreferences, lookaround, word boundaries, inline flags, possessive
quantifiers) is a ValueError naming the construct and its position; so is a malformed
pattern. The parse gives a tree of three kinds of node over code point sets:

    ("chars", ranges)          one character from the (lo, hi) code point ranges
    ("concat", items) / ("alt", items)
    ("repeat", item, lo, hi)   hi None: unbounded

automaton.py turns the tree into the NFA and then the minimal DFA over bytes.
"""
from __future__ import annotations

from .automaton import DFA, nfa_from_tree, minimal_dfa
from .utf8 import MAX_CODE_POINT, SURROGATES, complement, merge_ranges

MAX_REPEAT = 1000  # a {m,n} bound above this would build a huge automaton
DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
CATEGORIES = {"d": DIGIT, "w": WORD, "s": SPACE, "D": complement(DIGIT),
              "W": complement(WORD), "S": complement(SPACE)}
SIMPLE_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
ANY_BUT_NEWLINE = complement(((0x0A, 0x0A),))
EMPTY = ("concat", ())


def compile_regex(pattern) -> DFA:
    """The minimal DFA over bytes of the strings `pattern` fully matches."""
    if not isinstance(pattern, str):
        raise ValueError(f"regex: the pattern must be a str, got {type(pattern).__name__}")
    return minimal_dfa(nfa_from_tree(parse(pattern)), pattern)


def chars(*ranges):
    return ("chars", merge_ranges(ranges))


def literal(text):
    """The tree of a literal string (json_schema.py builds trees and patterns alike)."""
    return ("concat", tuple(chars((ord(c), ord(c))) for c in text))


class RegexError(ValueError):
    pass


class Parser:
    """Recursive descent: alternation of concatenations of quantified atoms."""

    def __init__(self, pattern):
        self.text, self.pos = pattern, 0

    def error(self, what, at=None):
        at = self.pos if at is None else at
        return RegexError(f"regex {self.text!r}: {what} at position {at}")

    def peek(self, n=1):
        return self.text[self.pos:self.pos + n]

    def take(self):
        c = self.text[self.pos]
        self.pos += 1
        return c

    def done(self):
        return self.pos >= len(self.text)

    # ------------------------------------------------------------ structure

    def alternation(self, depth):
        branches = [self.concatenation(depth)]
        while self.peek() == "|":
            self.take()
            branches.append(self.concatenation(depth))
        return branches[0] if len(branches) == 1 else ("alt", tuple(branches))

    def concatenation(self, depth):
        items = []
        while not self.done() and self.peek() not in "|)":
            at = self.pos
            c = self.peek()
            if c in "*+?" or (c == "{" and self.quantifier_ahead()):
                if not items or items[-1] is None:
                    raise self.error("nothing to repeat")
                if items[-1][0] == "repeat" and self.repeated_last:
                    raise self.error("multiple repeat")
                items[-1] = self.quantified(items[-1])
                self.repeated_last = True
                continue
            self.repeated_last = False
            if c == "^" or c == "$":
                self.take()
                first, last = at == 0, self.done()
                if (c == "^" and first) or (c == "$" and last):
                    continue  # a full match starts and ends there anyway
                raise self.error(f"the anchor {c!r} inside the pattern is not supported "
                                 f"(only a leading ^ or a trailing $)", at)
            items.append(self.atom(depth))
        self.repeated_last = False
        return items[0] if len(items) == 1 else ("concat", tuple(items))

    repeated_last = False

    def quantifier_ahead(self):
        """(lo, hi, length) if a {m}, {m,n}, {m,} or {,n} quantifier starts here, else None
        (then `{` is a literal, as in `re`)."""
        end = self.text.find("}", self.pos)
        if end < 0:
            return None
        body = self.text[self.pos + 1:end]
        lo, comma, hi = body.partition(",")
        if not (lo.isascii() and hi.isascii() and (lo.isdigit() or lo == "")
                and (hi.isdigit() or hi == "")) or body == "":
            return None
        return (int(lo) if lo else 0, (int(hi) if hi else None) if comma else int(lo),
                end + 1 - self.pos)

    def quantified(self, item):
        at = self.pos
        c = self.take()
        if c == "{":
            self.pos = at
            lo, hi, length = self.quantifier_ahead()
            self.pos = at + length
        else:
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if hi is not None and lo > hi:
            raise self.error("min repeat greater than max repeat", at + 1)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"a repeat count above {MAX_REPEAT} is not supported", at + 1)
        if self.peek() == "+":
            raise self.error("a possessive quantifier is not supported")
        if self.peek() == "?":
            self.take()  # lazy: the same language under a full match
        return ("repeat", item, lo, hi)

    def atom(self, depth):
        at = self.pos
        c = self.take()
        if c == "(":
            return self.group(at, depth)
        if c == ")":
            raise self.error("unbalanced parenthesis", at)
        if c == "[":
            return self.char_class(at)
        if c == ".":
            return ("chars", ANY_BUT_NEWLINE)
        if c == "\\":
            return self.escape(at, in_class=False)
        return chars((ord(c), ord(c)))

    def group(self, at, depth):
        if depth > 100:
            raise self.error("groups nested too deep", at)
        if self.peek() == "?":
            self.take()
            kind = self.peek(2)
            if kind[:1] == ":":
                self.take()
            elif kind == "P<":
                self.pos += 2
                end = self.text.find(">", self.pos)
                name = self.text[self.pos:end] if end >= 0 else ""
                if not name.isidentifier():
                    raise self.error("bad group name", self.pos)
                self.pos = end + 1
            else:
                raise self.error(self.extension_name(kind), at)
        inner = self.alternation(depth + 1)
        if self.done():
            raise self.error("missing ), unterminated subpattern", at)
        self.take()
        return inner

    @staticmethod
    def extension_name(kind):
        names = {"P=": "a backreference (?P=name)", "=": "lookahead (?=...)",
                 "!": "negative lookahead (?!...)", "<=": "lookbehind (?<=...)",
                 "<!": "negative lookbehind (?<!...)", "#": "a comment group (?#...)",
                 ">": "an atomic group (?>...)", "(": "a conditional group (?(...)...)"}
        for prefix in ("P=", "<=", "<!", "=", "!", "#", ">", "("):
            if kind.startswith(prefix):
                return f"{names[prefix]} is not supported"
        if kind[:1] and kind[:1] in "aiLmsux-":
            return "inline flags (?aiLmsux) are not supported"
        return f"unknown extension (?{kind[:1]}"

    def char_class(self, at):
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges, first = [], True
        while True:
            if self.done():
                raise self.error("unterminated character set", at)
            if self.peek() == "]" and not first:
                self.take()
                break
            first = False
            lo_at = self.pos
            lo = self.class_item()
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):  # a range, not "-]"
                self.take()
                hi = self.class_item()
                single = all(len(r) == 1 and r[0][0] == r[0][1] for r in (lo, hi))
                if not single or hi[0][0] < lo[0][0]:  # [a-\d] or [z-a]
                    raise self.error("bad character range", lo_at)
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        return ("chars", complement(ranges) if negated else merge_ranges(ranges))

    def class_item(self):
        """The code point ranges of one class member: a character or an escape."""
        at = self.pos
        c = self.take()
        if c == "\\":
            return self.escape(at, in_class=True)[1]
        return ((ord(c), ord(c)),)

    def escape(self, at, *, in_class):
        if self.done():
            raise self.error("bad escape (end of pattern)", at)
        c = self.take()
        if c in CATEGORIES:
            return ("chars", CATEGORIES[c])
        if c in SIMPLE_ESCAPES:
            return chars((SIMPLE_ESCAPES[c],) * 2)
        if c == "b" and in_class:
            return chars((8, 8))
        if c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits = self.text[self.pos:self.pos + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"incomplete escape \\{c}{digits}", at)
            self.pos += width
            cp = int(digits, 16)
            if cp > MAX_CODE_POINT:
                raise self.error(f"bad escape \\{c}{digits}", at)
            if SURROGATES[0] <= cp <= SURROGATES[1]:
                raise self.error(f"a surrogate \\{c}{digits} has no UTF-8", at)
            return chars((cp, cp))
        if c == "0":
            if self.peek() and self.peek() in "01234567":
                raise self.error("an octal escape is not supported (use \\xhh)", at)
            return chars((0, 0))
        if c.isdigit():
            what = "an octal escape" if in_class else f"a backreference \\{c}"
            raise self.error(f"{what} is not supported", at)
        if c in "AZbB":
            what = {"A": "the anchor \\A", "Z": "the anchor \\Z", "b": "a word boundary \\b",
                    "B": "a non-boundary \\B"}[c]
            raise self.error(f"{what} is not supported", at)
        if c == "N":
            raise self.error("a named character \\N{...} is not supported", at)
        if c.isascii() and c.isalpha():
            raise self.error(f"bad escape \\{c}", at)
        return chars((ord(c), ord(c)))


def parse(pattern):
    """The syntax tree of a pattern (module docstring); ValueError naming what is wrong."""
    p = Parser(pattern)
    tree = p.alternation(0)
    if not p.done():  # alternation stops only at the end or at a ")" without its "("
        raise p.error("unbalanced parenthesis")
    return tree
