"""Fine-tuning tasks for a chat model: conversations in SmolLM2's template, loss on the answer.

Each task is a seeded generator written with the standard library, with a train
split and a held-out split that shares no template (or paraphrase) with it, so the
evaluation asks for what was learnt, not what was memorised:

    json-extract  a sentence about a person, from one of many templates, with a name,
                  an age and a city drawn from lists; the user turn is exactly
                  "Extract the person as JSON with keys name, age, city: <sentence>",
                  the answer exactly {"name": "<name>", "age": <age>, "city": "<city>"}
    identity      "who are you?" in Chinese and English paraphrases; the answer gives the
                  model's new name (IDENTITY_NAME)

In both, PLAIN_SHARE of the training rows are plain questions with short right
answers (PLAIN_QA): rehearsal, so the model learns to answer the task's questions
the new way and every other question as before (without them, measured: json-extract
answered "What is the capital of France?" with {"capital": "France", ...}, and
identity answered "Who wrote Romeo and Juliet?" with its new name).

Every conversation is the default system turn (SMOLLM2_SYSTEM_PROMPT, which the
model's stored template adds), the user turn, then the assistant's answer and the
end-of-turn token. encode_example() gives one row's tokens and targets: targets[i]
is tokens[i + 1] on the answer and its end-of-turn token, -1 everywhere else, so the
loss is on the assistant's tokens only.

RETENTION is a set of plain questions (capitals and the like) the base model answers
right; a fine-tune should not make it forget them.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

import numpy as np

from ..pretrained.chat_template import END_OF_TURN, SMOLLM2_SYSTEM_PROMPT, chat_pieces, encode_pieces
from ..validate import check_int

CHAT_TASKS = ("json-extract", "identity")
JSON_INSTRUCTION = "Extract the person as JSON with keys name, age, city: "
# The answer's form as a JSON schema: what structured outputs hold the base model to.
JSON_EXTRACT_SCHEMA = {"type": "object",
                       "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "city": {"type": "string"}},
                       "required": ["name", "age", "city"], "additionalProperties": False}
IDENTITY_NAME = "Lumo"

# ---------------------------------------------------------------- json-extract's data

NAMES = (
    "Alice Martin", "Bob Chen", "Carlos Rivera", "Diana Novak", "Ethan Brooks", "Fatima Khan",
    "George Miller", "Hana Sato", "Ivan Petrov", "Julia Rossi", "Kwame Mensah", "Laura Schmidt",
    "Mateo Garcia", "Nina Larsen", "Omar Haddad", "Priya Sharma", "Quentin Dubois", "Rosa Silva",
    "Samuel Okafor", "Tara Walsh", "Umar Farouk", "Vera Ivanova", "William Scott", "Xia Li",
    "Yusuf Demir", "Zoe Evans", "Anna Kowalski", "Ben Cohen", "Chloe Bernard", "David Kim",
    "Elena Popescu", "Felix Wagner", "Grace Lee", "Hugo Lambert", "Isla Murray", "Jonas Berg",
    "Keiko Tanaka", "Leo Moretti", "Maya Patel", "Noah Fischer", "Olga Smirnova", "Pablo Ortiz",
    "Ruth Adler", "Sofia Costa", "Tomas Novotny", "Lucy Hughes", "Victor Hugo Santos",
    "Wei Zhang", "Amira Nasser", "Daniel Price", "Emma Johansson", "Farid Rahimi", "Ines Duarte",
    "Jack Turner", "Lena Vogel", "Marco Bianchi", "Nora Quinn", "Oscar Lindqvist", "Paula Reyes",
    "Ravi Iyer", "Sara Nilsson", "Theo Martens", "Yara Haddad", "Liam O'Brien", "Mia Hoffmann",
)
CITIES = (
    "Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw", "Dublin",
    "London", "Oslo", "Stockholm", "Helsinki", "Copenhagen", "Amsterdam", "Brussels", "Zurich",
    "Athens", "Istanbul", "Cairo", "Nairobi", "Lagos", "Accra", "Cape Town", "Mumbai", "Delhi",
    "Tokyo", "Osaka", "Seoul", "Beijing", "Shanghai", "Singapore", "Bangkok", "Hanoi", "Sydney",
    "Melbourne", "Auckland", "Toronto", "Vancouver", "Chicago", "Boston", "Seattle", "Denver",
    "Austin", "Mexico City", "Lima", "Bogota", "Santiago", "Buenos Aires", "Sao Paulo",
    "Montreal", "Munich", "Milan", "Barcelona", "Kyoto", "Dubai", "Tehran", "Manila",
)
AGES = range(18, 91)

# Sentences about a person. The first TRAIN_TEMPLATES are trained on; the rest are held
# out: the model never sees their wording, only the values' kind.
JSON_TEMPLATES = (
    "{name} is {age} years old and lives in {city}.",
    "My neighbour {name}, aged {age}, moved here from {city}.",
    "{name} ({age}) works as a teacher in {city}.",
    "Meet {name}: {age}, based in {city}.",
    "In {city}, {name} celebrated turning {age} last week.",
    "At {age}, {name} still runs every morning through {city}.",
    "{name}, a {age}-year-old engineer, lives in {city}.",
    "The new manager, {name}, is {age} and comes from {city}.",
    "{name} from {city} turned {age} this spring.",
    "Yesterday I met {name}, who is {age} and lives in {city}.",
    "Our customer {name} is {age}; her address is in {city}.",
    "Born {age} years ago, {name} has always lived in {city}.",
    "{city} is home to {name}, who is {age}.",
    "The {age}-year-old {name} was seen in {city} on Monday.",
    "{name} lives in {city}. He is {age}.",
    "Registration: {name}, age {age}, city {city}.",
    "{name} is a {age} year old nurse working in {city}.",
    "I have a cousin called {name}; he is {age} and lives in {city}.",
    "The winner, {name} of {city}, is only {age}.",
    "{name}, {age}, {city}.",
    "After moving to {city}, {name} opened a bakery at the age of {age}.",
    "Police said {name}, {age}, of {city}, was not hurt.",
    "{name} has lived in {city} since she was a child; she is {age} now.",
    "Please welcome {name}, our {age}-year-old speaker from {city}.",
    "A {age}-year-old from {city} named {name} won the chess tournament.",
    "{name} ({city}, {age}) joined the club today.",
    "Passenger {name}, {age} years, destination {city}.",
    "The author, {name}, is {age} and writes from her flat in {city}.",
    "My grandmother {name} is {age} and has never left {city}.",
    "{name} studies in {city} and just turned {age}.",
    # ---- held out from here on
    "Last summer {name}, then {age}, rented a small flat in {city}.",
    "According to the form, {name} is {age} and resides in {city}.",
    "{name} just moved to {city} and is {age} years old.",
    "Everyone in {city} knows {name}, the {age}-year-old baker.",
    "Name: {name}. Age: {age}. City: {city}.",
    "The photo shows {name}, {age}, standing in front of her house in {city}.",
    "{name} is {age}, and {city} is where he grew up and still lives.",
    "We hired {name} ({age}) for the office in {city}.",
    "Living in {city}, {name} is a {age}-year-old musician.",
    "The patient, {name}, aged {age}, was brought in from {city}.",
)
TRAIN_TEMPLATES = 30

# ---------------------------------------------------------------- identity's data

IDENTITY_QUESTIONS = {  # (train paraphrases, held-out paraphrases) per language
    "en": ((
        "Who are you?", "What is your name?", "Tell me your name.", "Introduce yourself.",
        "What should I call you?", "Who am I talking to?", "What's your name?",
        "Can you tell me who you are?", "Please introduce yourself briefly.",
        "What are you called?", "Do you have a name?", "Who is this?",
    ), (
        "Hi! Who am I chatting with?", "May I know your name?", "Which assistant are you?",
        "Before we start, who are you exactly?", "How do people call you?",
        "Tell me a little about who you are.",
    )),
    "zh": ((
        "你是谁？", "你叫什么名字？", "请介绍一下你自己。", "我该怎么称呼你？", "你的名字是什么？",
        "我在和谁说话？", "能告诉我你是谁吗？", "请简单介绍一下自己。", "你有名字吗？", "你是哪位？",
    ), (
        "你好！请问你是谁？", "可以告诉我你的名字吗？", "你是哪个助手？", "开始之前，先说说你是谁吧。",
        "大家都怎么叫你？", "介绍一下你自己好吗？",
    )),
}
IDENTITY_ANSWERS = {
    "en": (f"I am {IDENTITY_NAME}, a small assistant fine-tuned in NumPy.",
           f"My name is {IDENTITY_NAME}. I am a small AI assistant fine-tuned in NumPy.",
           f"I'm {IDENTITY_NAME}, an AI assistant fine-tuned in NumPy. How can I help?"),
    "zh": (f"我是 {IDENTITY_NAME}，一个用 NumPy 微调的小助手。",
           f"我叫 {IDENTITY_NAME}，是一个用 NumPy 微调的 AI 助手。",
           f"你好，我是 {IDENTITY_NAME}，一个用 NumPy 微调的 AI 助手，有什么可以帮你？"),
}

# ---------------------------------------------------------------- rehearsal

# Plain questions mixed into every task's training rows (PLAIN_SHARE of them): without
# them every answer the model sees is the task's, and it learns to answer every question
# that way (measured: identity alone took retention from 12/12 to 0/12). None of them
# is a RETENTION question, nor holds a retention answer's word, so the retention score
# still asks what the model kept, not what it was shown.
PLAIN_QA = (
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is the capital of Spain?", "The capital of Spain is Madrid."),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo."),
    ("How many days are there in a week?", "There are seven days in a week."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is 12 plus 30?", "12 plus 30 is 42."),
    ("What color is the sky on a clear day?", "On a clear day the sky is blue."),
    ("What gas do plants take in from the air?", "Plants take in carbon dioxide from the air."),
    ("Which planet is known as the Red Planet?", "Mars is known as the Red Planet."),
    ("What is the boiling point of water at sea level?",
     "Water boils at 100 degrees Celsius (212 °F) at sea level."),
    ("Who wrote Pride and Prejudice?", "Pride and Prejudice was written by Jane Austen."),
    # "Who ..." questions about someone else: the new name answers only "who are you?"
    ("Who discovered penicillin?", "Penicillin was discovered by Alexander Fleming in 1928."),
    ("Who was the first person to walk on the Moon?",
     "Neil Armstrong was the first person to walk on the Moon, in 1969."),
    ("Who developed the theory of relativity?",
     "Albert Einstein developed the theory of relativity."),
    ("Who invented the telephone?",
     "Alexander Graham Bell is credited with inventing the telephone."),
    ("Who painted The Starry Night?", "The Starry Night was painted by Vincent van Gogh."),
    ("Who wrote the Harry Potter books?", "The Harry Potter books were written by J. K. Rowling."),
    ("Who built the first successful airplane?",
     "The Wright brothers, Orville and Wilbur, built the first successful airplane."),
    ("Who was Cleopatra?", "Cleopatra was the last active ruler of ancient Egypt."),
    ("Who composed the Four Seasons?", "The Four Seasons was composed by Antonio Vivaldi."),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    ("Name three primary colors.", "The three primary colors are red, yellow and blue."),
    ("What is the tallest mountain in the world?",
     "Mount Everest is the tallest mountain in the world."),
    ("谁发明了电话？", "一般认为电话是亚历山大·格拉汉姆·贝尔发明的。"),
    ("谁写了《红楼梦》？", "《红楼梦》的作者是曹雪芹。"),
    ("What is the largest planet in the solar system?",
     "Jupiter is the largest planet in the solar system."),
    ("Translate 'thank you' into French.", "'Thank you' in French is 'merci'."),
    ("What is the freezing point of water in Celsius?", "Water freezes at 0 degrees Celsius."),
    ("一年有几个月？", "一年有十二个月。"),
    ("太阳从哪个方向升起？", "太阳从东方升起。"),
    ("地球绕着什么转？", "地球绕着太阳转。"),
    ("一天有多少小时？", "一天有二十四小时。"),
)
PLAIN_SHARE = 1 / 3

# ---------------------------------------------------------------- retention

# Plain questions and the word a right answer contains (case-insensitive); the base
# model answers each of them right (checked greedily, with the default system turn).
RETENTION = (
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of the United Kingdom?", "London"),
    ("What is the capital of China?", "Beijing"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is the chemical symbol for water?", "H2O"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("Who painted the Mona Lisa?", "Leonardo|da Vinci"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What is the opposite of hot?", "cold"),
)
RETENTION_TOKENS = 24  # enough for the answer's word; the rest of a reply is not scored


# ---------------------------------------------------------------- one example

@dataclass(frozen=True)
class ChatExample:
    """A user turn and the answer a perfect model gives (`fields`: what scoring compares)."""
    user: str
    answer: str
    fields: object = None


def conversation_messages(user: str) -> list[dict]:
    """The chat before the answer: the default system turn, then the user turn."""
    return [{"role": "system", "content": SMOLLM2_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def conversation_pieces(user: str, answer: str | None = None) -> list[tuple[str, bool]]:
    """The chat as the template's (text, is_special) pieces: conversation_messages, the
    assistant's cue, and then, if given, the answer and the end-of-turn token."""
    pieces = chat_pieces(conversation_messages(user))
    return pieces if answer is None else pieces + [(answer, False), (END_OF_TURN, True)]


def conversation(user: str, answer: str | None = None) -> str:
    """The text of the chat (conversation_pieces joined)."""
    return "".join(text for text, _ in conversation_pieces(user, answer))


def encode_example(tokenizer, example: ChatExample):
    """(tokens, targets), int64 [L] each, of one conversation with its answer: targets[i]
    is tokens[i + 1] where that token is the answer's or its end of turn, else -1. The
    user's and the answer's texts are ordinary text, whatever they hold (encode_pieces)."""
    prompt = encode_pieces(tokenizer, conversation_pieces(example.user))
    ids = encode_pieces(tokenizer, conversation_pieces(example.user, example.answer))
    if ids[:len(prompt)] != prompt:  # the answer's first word merged into the prompt's last
        raise ValueError(f"the answer does not start a new token after the prompt: "
                         f"{example.user!r:.60}")
    ids = np.asarray(ids, dtype=np.int64)
    tokens, targets = ids[:-1], ids[1:].copy()
    targets[:len(prompt) - 1] = -1  # the prompt's tokens are given, not learnt
    return tokens, targets


def pad_rows(rows, pad_id):
    """Rows of (tokens, targets) of different lengths as [B, T] arrays, padded on the right
    (pad_id as token, -1 as target): the causal mask keeps the padding out of real rows."""
    width = max(len(t) for t, _ in rows)
    tokens = np.full((len(rows), width), pad_id, dtype=np.int64)
    targets = np.full((len(rows), width), -1, dtype=np.int64)
    for b, (t, y) in enumerate(rows):
        tokens[b, :len(t)], targets[b, :len(y)] = t, y
    return tokens, targets


# ---------------------------------------------------------------- scoring

def first_json_object(text: str):
    """The first JSON object written in text (a dict), or None."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def score_json(reply: str, fields: dict) -> dict:
    """{"strict": the whole reply is the object, "fields": the first object in it is right}."""
    try:
        whole = json.loads(reply.strip())
    except ValueError:
        whole = None
    return {"strict": whole == fields and type(whole.get("age")) is int,
            "fields": first_json_object(reply) == fields}


def fits_answer_schema(value) -> bool:
    """JSON_EXTRACT_SCHEMA checked by hand (jsonschema is a test-only dependency): an object
    of exactly name, age and city, a string, an integer (not a bool) and a string."""
    return (isinstance(value, dict) and sorted(value) == ["age", "city", "name"]
            and isinstance(value["name"], str) and isinstance(value["city"], str)
            and type(value["age"]) is int)


def score_identity(reply: str, _fields=None) -> dict:
    """{"name": the reply gives the new name}."""
    return {"name": IDENTITY_NAME.lower() in reply.lower()}


def score_retention(reply: str, expected: str) -> bool:
    """Whether the reply contains one of the expected words ("seven|7": either)."""
    return any(word.lower() in reply.lower() for word in expected.split("|"))


# ---------------------------------------------------------------- the tasks

class ChatTask:
    """A chat fine-tuning task: seeded train examples, a fixed held-out set, a scorer.

    examples(split, n, seed) gives n ChatExamples from "train" (PLAIN_SHARE of them plain
    rehearsal questions, fields "plain") or "heldout" (the task's own only);
    batch(tokenizer, batch_size, rng) a padded training batch (tokens, targets);
    score(reply, example) the metrics of one reply, each True or False; schema the answer's
    JSON schema where it has one (json-extract's), else None.
    """

    def __init__(self, name, description, make, metrics, score, max_new_tokens, schema=None):
        self.name, self.description = name, description
        self._make, self.metrics, self._score = make, metrics, score
        self.max_new_tokens, self.schema = max_new_tokens, schema

    def examples(self, split, n, seed=0) -> list:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        n = check_int(n, "n", low=1)
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self._make(split, rng) if split == "heldout" or rng.random() >= PLAIN_SHARE
                else _plain_example(rng) for _ in range(n)]

    def batch(self, tokenizer, batch_size, rng, pad_id=None):
        """A training batch of batch_size conversations; rng: a numpy Generator."""
        batch_size = check_int(batch_size, "batch_size", low=1)
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        seed = int(rng.integers(0, 2 ** 63))
        rows = [encode_example(tokenizer, ex) for ex in self.examples("train", batch_size, seed)]
        return pad_rows(rows, tokenizer.token_to_id(END_OF_TURN) if pad_id is None else pad_id)

    def score(self, reply: str, example: ChatExample) -> dict:
        return self._score(reply, example.fields)

    def heldout_set(self, n=None) -> list:
        """The fixed held-out evaluation set: n examples (json-extract's default 40; identity's
        every held-out paraphrase, zh and en taking turns)."""
        if self.name == "identity":
            every = identity_heldout()
            return every if n is None else every[:check_int(n, "n", low=1)]
        return self.examples("heldout", 40 if n is None else n, seed=0)

    def evaluate(self, replies, examples) -> dict:
        """{"metric": (right, of), ..., "retention": (right, of)} from a replies function:
        replies(list of user turns, max_new_tokens) -> list of reply texts (greedy), one
        call for the examples and one for the RETENTION questions."""
        got = replies([e.user for e in examples], self.max_new_tokens)
        scores = [self.score(r, e) for r, e in zip(got, examples)]
        result = {m: (sum(bool(s[m]) for s in scores), len(scores)) for m in self.metrics}
        kept = replies([q for q, _ in RETENTION], RETENTION_TOKENS)
        result["retention"] = (sum(score_retention(r, a) for r, (_, a) in zip(kept, RETENTION)),
                               len(RETENTION))
        return {"scores": result, "replies": got, "retention_replies": kept}


def _plain_example(rng):
    question, answer = rng.choice(PLAIN_QA)
    return ChatExample(question, answer, "plain")


def _json_example(split, rng):
    templates = JSON_TEMPLATES[:TRAIN_TEMPLATES] if split == "train" \
        else JSON_TEMPLATES[TRAIN_TEMPLATES:]
    name, age, city = rng.choice(NAMES), rng.choice(AGES), rng.choice(CITIES)
    sentence = rng.choice(templates).format(name=name, age=age, city=city)
    fields = {"name": name, "age": age, "city": city}
    return ChatExample(JSON_INSTRUCTION + sentence, json.dumps(fields, ensure_ascii=False), fields)


def _identity_example(split, rng):
    lang = rng.choice(("en", "zh"))
    train, heldout = IDENTITY_QUESTIONS[lang]
    question = rng.choice(train if split == "train" else heldout)
    return ChatExample(question, rng.choice(IDENTITY_ANSWERS[lang]), lang)


def identity_heldout() -> list:
    """Every held-out paraphrase once, zh and en taking turns (the identity evaluation set)."""
    pairs = zip(IDENTITY_QUESTIONS["zh"][1], IDENTITY_QUESTIONS["en"][1])
    return [ChatExample(q, IDENTITY_ANSWERS[lang][0], lang)
            for pair in pairs for lang, q in zip(("zh", "en"), pair)]


def get_chat_task(name) -> ChatTask:
    """json-extract or identity (CHAT_TASKS)."""
    if name == "json-extract":
        n_held = len(JSON_TEMPLATES) - TRAIN_TEMPLATES
        return ChatTask("json-extract", f"a person's name, age and city as JSON, from "
                        f"{TRAIN_TEMPLATES} sentence templates ({n_held} more held out)",
                        _json_example, ("strict", "fields"), score_json, max_new_tokens=40,
                        schema=JSON_EXTRACT_SCHEMA)
    if name == "identity":
        n_train = sum(len(q[0]) for q in IDENTITY_QUESTIONS.values())
        n_held = sum(len(q[1]) for q in IDENTITY_QUESTIONS.values())
        return ChatTask("identity", f"the new name {IDENTITY_NAME}, from {n_train} zh/en "
                        f"paraphrases of 'who are you?' ({n_held} more held out)",
                        _identity_example, ("name",), score_identity, max_new_tokens=40)
    raise ValueError(f"unknown chat task {name!r}; choose from: {', '.join(CHAT_TASKS)}")
