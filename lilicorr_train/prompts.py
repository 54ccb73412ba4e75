"""Training prompts, never the evaluation probe sets (the bundled probes stay held out); deterministic for a seed:

- templates: chat requests (written, explained, listed, compared, solved) and Python stubs, from the templates
  and word lists in this file;
- stdlib: real documented functions of this interpreter's standard library, to complete, explain or rewrite;
- self: openers that the target finishes into user requests itself (sampled; `data.self_written_prompts`)."""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from pathlib import Path

from msgspec import Struct


class Prompt(Struct, frozen=True):
    text: str
    chat: bool  # True: wrapped in the target's chat template; False: raw text to continue (code)
    kind: str


TOPICS = [
    "photosynthesis",
    "the water cycle",
    "black holes",
    "the French Revolution",
    "machine learning",
    "vaccines",
    "climate change",
    "the stock market",
    "volcanoes",
    "the human heart",
    "electric cars",
    "the Roman Empire",
    "recycling",
    "solar panels",
    "the internet",
    "honey bees",
    "earthquakes",
    "the immune system",
    "chess",
    "coffee",
    "the moon landing",
    "inflation",
    "rainforests",
    "DNA",
    "the printing press",
    "gravity",
    "jazz",
    "the Great Wall of China",
    "antibiotics",
    "cloud computing",
    "the Olympic Games",
    "sleep",
    "tea ceremonies",
    "renewable energy",
    "the Renaissance",
    "ocean tides",
    "dinosaurs",
    "blockchain",
    "meditation",
    "the periodic table",
    "rainbows",
    "the Silk Road",
    "bread baking",
    "hurricanes",
    "democracy",
    "penguins",
    "the speed of light",
    "compound interest",
    "origami",
    "glaciers",
    "the Industrial Revolution",
    "batteries",
    "friendship",
    "public speaking",
    "time management",
    "healthy eating",
    "learning a new language",
    "gardening",
    "remote work",
    "budgeting",
    "running a marathon",
    "camping",
    "video games",
    "social media",
    "libraries",
    "museums",
    "pyramids",
    "submarines",
    "satellites",
    "bicycles",
    "trains",
    "robots",
    "quantum computers",
    "the Amazon river",
    "deserts",
    "coral reefs",
    "wolves",
    "elephants",
    "mushrooms",
    "tornadoes",
    "the brain",
    "stars",
    "comets",
    "magnets",
    "clouds",
    "music theory",
    "painting",
    "poetry",
    "photography",
    "architecture",
    "the first computers",
    "space stations",
    "wind turbines",
    "plastic pollution",
    "airplanes",
    "nutrition",
]

CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.",
    "What is {topic}?",
    "Tell me three interesting facts about {topic}.",
    "Write a short paragraph about {topic}.",
    "Why is {topic} important?",
    "Give me a brief history of {topic}.",
    "How would you explain {topic} to a ten-year-old?",
    "What are the main advantages and disadvantages of {topic}?",
    "Write a short poem about {topic}.",
    "List five key ideas related to {topic}.",
    "Summarize what everyone should know about {topic} in a few sentences.",
    "Write a short story that involves {topic}.",
    "What are some common misconceptions about {topic}?",
    "Describe {topic} in one paragraph.",
    "Write a haiku about {topic}.",
    "How does {topic} affect daily life?",
    "What questions would a student ask about {topic}? Answer two of them.",
    "Write a tweet about {topic}.",
    "Give me a fun quiz question about {topic} and its answer.",
    "Compare {topic} and {other} in a few sentences.",
    "What is the connection between {topic} and {other}?",
    "Write a short dialogue between two friends talking about {topic}.",
    "Give me some tips about {topic}.",
    "What would happen if there were no {topic}?",
    "Write an introduction for an essay about {topic}.",
    "Explain the basics of {topic} step by step.",
]

INSTRUCTIONS = [
    "Write a polite email asking a colleague for help with a report.",
    "Give me a recipe for a simple pasta dish.",
    "Suggest a name for a small coffee shop and explain why.",
    "Write a thank-you note to a teacher.",
    "How can I improve my sleep?",
    "Plan a one-day trip to a city of your choice.",
    "Write a short motivational message for someone starting a new job.",
    "What should I pack for a beach vacation?",
    "Describe your ideal weekend.",
    "Give me a workout plan for beginners.",
    "How do I make a good first impression?",
    "Write a product description for a reusable water bottle.",
    "What are good habits for studying?",
    "Explain how to change a flat tire.",
    "Write a short speech for a friend's birthday.",
    "How do I start learning to play the guitar?",
    "Write a limerick about a cat.",
    "Give me advice for a job interview.",
    "Write a short review of an imaginary restaurant.",
    "How can I reduce stress at work?",
    "Write a short bedtime story about a dragon.",
    "What are some ways to save money on groceries?",
    "Describe a sunset over the ocean.",
    "Give me ideas for a science fair project.",
    "Write a letter to your future self.",
    "How do I write a good resume?",
    "Write an advertisement for a bookstore.",
    "What is the difference between weather and climate?",
    "Explain what a noun, a verb and an adjective are.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a short riddle and its answer.",
]

NAMES = [
    "Anna",
    "Ben",
    "Carlos",
    "Dina",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kate",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
]
ITEMS = ["apples", "pencils", "stickers", "books", "marbles", "cookies", "cards", "flowers", "eggs", "stamps"]

MATH_TEMPLATES = [
    "{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?",
    "{name} had {a} {item} and gave {c} to a friend. How many {item} are left?",
    "A box holds {b} {item}. How many {item} are in {k} boxes?",
    "{name} shares {m} {item} equally among {k} friends. How many {item} does each friend get?",
    "{name} earns ${a} per day. How much does {name} earn in {k} days?",
    "A shirt costs ${a}. It is on sale for {p}% off. What is the sale price?",
    "What is {a} plus {b}?",
    "What is {a} times {k}?",
    "What is {a} minus {c}?",
    "A train travels {a} miles in {k} hours. What is its average speed?",
    "{name} reads {b} pages a day. How many pages does {name} read in {k} weeks?",
    "The sum of two numbers is {a} and their difference is {d}. What are the numbers?",
    "A rectangle is {a} cm long and {b} cm wide. What is its area and perimeter?",
    "{name} is {k} years older than {other}. {other} is {b} years old. How old is {name}?",
]

CODE_TASKS = [
    ("reverse_string", "s: str", "str", "Return the string s reversed."),
    ("is_palindrome", "s: str", "bool", "Return True if s reads the same forwards and backwards."),
    ("count_vowels", "text: str", "int", "Count the vowels in text."),
    ("factorial", "n: int", "int", "Return n factorial."),
    ("fibonacci", "n: int", "int", "Return the n-th Fibonacci number."),
    ("is_prime", "n: int", "bool", "Return True if n is a prime number."),
    ("flatten", "nested: list", "list", "Flatten a list of lists into one list."),
    ("mean", "values: list", "float", "Return the arithmetic mean of values."),
    ("median", "values: list", "float", "Return the median of values."),
    ("unique", "items: list", "list", "Return the items without duplicates, keeping their order."),
    ("word_count", "text: str", "dict", "Count how often each word occurs in text."),
    ("gcd", "a: int, b: int", "int", "Return the greatest common divisor of a and b."),
    ("lcm", "a: int, b: int", "int", "Return the least common multiple of a and b."),
    ("celsius_to_fahrenheit", "c: float", "float", "Convert a temperature from Celsius to Fahrenheit."),
    ("max_subarray", "nums: list", "int", "Return the largest sum of a contiguous subarray of nums."),
    (
        "binary_search",
        "items: list, target: int",
        "int",
        "Return the index of target in the sorted list, or -1.",
    ),
    ("merge_sorted", "a: list, b: list", "list", "Merge two sorted lists into one sorted list."),
    ("chunk", "items: list, size: int", "list", "Split items into lists of at most size elements."),
    ("capitalize_words", "text: str", "str", "Capitalize the first letter of every word."),
    ("remove_whitespace", "text: str", "str", "Remove all whitespace characters from text."),
    ("sum_digits", "n: int", "int", "Return the sum of the decimal digits of n."),
    ("is_anagram", "a: str, b: str", "bool", "Return True if a and b are anagrams of each other."),
    ("transpose", "matrix: list", "list", "Return the transpose of a matrix given as a list of rows."),
    ("running_total", "values: list", "list", "Return the running totals of values."),
    ("second_largest", "values: list", "int", "Return the second largest distinct value."),
    (
        "count_words_longer_than",
        "text: str, n: int",
        "int",
        "Count the words in text longer than n characters.",
    ),
    ("rotate_list", "items: list, k: int", "list", "Rotate items to the right by k positions."),
    ("to_binary", "n: int", "str", "Return the binary representation of a non-negative integer."),
    ("parse_csv_line", "line: str", "list", "Split a comma-separated line into its fields, stripped."),
    ("dict_invert", "mapping: dict", "dict", "Swap the keys and values of a dictionary."),
    ("clamp", "x: float, low: float, high: float", "float", "Limit x to the range [low, high]."),
    ("pairwise_sums", "nums: list", "list", "Return the sums of each pair of neighbouring numbers."),
    ("longest_word", "text: str", "str", "Return the longest word in text."),
    ("is_sorted", "items: list", "bool", "Return True if items are in non-decreasing order."),
    ("power_set", "items: list", "list", "Return every subset of items."),
    ("caesar_shift", "text: str, shift: int", "str", "Shift every letter of text by shift places."),
    ("matrix_multiply", "a: list, b: list", "list", "Multiply two matrices given as lists of rows."),
    ("triangle_area", "base: float, height: float", "float", "Return the area of a triangle."),
    ("count_positive", "nums: list", "int", "Count the numbers greater than zero."),
    ("find_duplicates", "items: list", "list", "Return the items that appear more than once."),
]


def chat_prompts(rng: random.Random, count: int) -> list[Prompt]:
    out = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.55:
            topic, other = rng.sample(TOPICS, 2)
            text = rng.choice(CHAT_TEMPLATES).format(topic=topic, other=other)
            kind = "chat"
        elif roll < 0.75:
            text, kind = rng.choice(INSTRUCTIONS), "chat"
        else:
            name, other = rng.sample(NAMES, 2)
            k = rng.randint(2, 9)
            text = rng.choice(MATH_TEMPLATES).format(
                name=name,
                other=other,
                item=rng.choice(ITEMS),
                a=rng.randint(10, 99),
                b=rng.randint(2, 40),
                c=rng.randint(1, 9),
                d=rng.randint(1, 9) * 2,
                k=k,
                m=k * rng.randint(2, 12),
                p=rng.choice([10, 20, 25, 50]),
            )
            kind = "math"
        out.append(Prompt(text, True, kind))
    return out


def code_prompts(rng: random.Random, count: int) -> list[Prompt]:
    out = []
    for _ in range(count):
        name, args, returns, doc = rng.choice(CODE_TASKS)
        roll = rng.random()
        if roll < 0.6:
            header = rng.choice(["", "", "from typing import List\n\n\n", "import math\n\n\n"])
            example = ""
            if rng.random() < 0.7:
                shown = ", ".join(str(rng.randint(0, 99)) for _ in args.split(","))
                example = f"\n    >>> {name}({shown})\n"
            prefix = rng.choice(["", "", "", "compute_", "get_", "my_"])
            text = f'{header}def {prefix}{name}({args}) -> {returns}:\n    """{doc}{example}\n    """\n'
            out.append(Prompt(text, False, "code"))
        else:
            verb = rng.choice(["Write a Python function", "Implement a Python function", "Write a function"])
            text = f"{verb} `{name}({args})` that does the following: {doc[0].lower()}{doc[1:]}"
            out.append(Prompt(text, True, "code"))
    return out


def training_prompts(count: int, seed: int = 0, code_share: float = 0.35) -> list[Prompt]:
    """`count` prompts, about `code_share` of them code, shuffled."""
    rng = random.Random(seed)
    code = int(round(count * code_share))
    prompts = chat_prompts(rng, count - code) + code_prompts(rng, code)
    rng.shuffle(prompts)
    return prompts


# ---------------------------------------------------------------- real code: the Python standard library

STDLIB_FILES = 4000  # source files read at most (the whole standard library)


@functools.cache
def _stdlib_functions(limit_files: int) -> tuple[tuple[str, str, str, str], ...]:
    """(header + docstring, whole function source, first docstring line, signature) of the documented top-level and
    method functions in this interpreter's standard library (tests and idlelib left out), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, str, str]] = []
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not ({"test", "tests", "idlelib", "site-packages", "lib2to3"} & set(p.relative_to(root).parts))
    )
    for path in files[:limit_files]:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            body_end = node.end_lineno or node.lineno
            if not doc or len(doc) < 20 or not node.body or body_end - node.lineno > 40:
                continue
            first = node.body[0]
            if (
                not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant))
                or len(node.body) < 2
            ):
                continue
            indent = node.col_offset
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            head = "\n".join(line[indent:] for line in lines[start : first.end_lineno])
            whole = "\n".join(line[indent:] for line in lines[start:body_end])
            signature = f"{node.name}({ast.unparse(node.args)})"  # one line, whatever the source's layout
            found.append((head + "\n", whole + "\n", doc.strip().splitlines()[0], signature))
    return tuple(found)


def stdlib_code_prompts(rng: random.Random, count: int) -> list[Prompt]:
    """Code prompts from real functions: a documented signature to complete (raw text), or a chat request to
    explain a whole function or to write one from its first docstring line."""
    functions = _stdlib_functions(STDLIB_FILES)
    if not functions:
        raise ValueError("no documented functions found in the standard library of this interpreter")
    out = []
    for _ in range(count):
        head, whole, summary, signature = rng.choice(functions)
        roll = rng.random()
        if roll < 0.5:
            out.append(Prompt(head, False, "code"))
        elif roll < 0.75:
            ask = rng.choice(
                [
                    "Explain what this Python function does:",
                    "What does this code do?",
                    "Review this Python function and suggest an improvement:",
                    "Add comments to this function:",
                ]
            )
            out.append(Prompt(f"{ask}\n\n```python\n{whole}```", True, "code"))
        else:
            out.append(Prompt(f"Write a Python function `{signature}`: {summary}", True, "code"))
    return out


# ---------------------------------------------------------------- requests the target writes itself

OPENERS = [
    "How",
    "What",
    "Why",
    "Can you",
    "Could you",
    "Please",
    "Write",
    "Explain",
    "Describe",
    "Give me",
    "Tell me",
    "I",
    "My",
    "I'm",
    "Help me",
    "Create",
    "Summarize",
    "Compare",
    "List",
    "Solve",
    "Calculate",
    "If",
    "A",
    "There are",
    "Which",
    "When",
    "Where",
    "Who",
    "Is it",
    "Should I",
    "Do you",
    "Imagine",
    "Suppose",
    "Translate",
    "Rewrite",
    "Generate",
    "Design",
    "Plan",
    "Suggest",
    "Find",
    "Show me",
    "What is the difference between",
    "What are the best",
    "How many",
    "How much",
    "John has",
    "A train",
    "Sarah bought",
    "In Python,",
    "Write a function that",
    "Write a program",
    "Debug this",
    "Fix the",
    "What happens when",
]


def request_openers(rng: random.Random, count: int) -> list[str]:
    """The first words of `count` user requests the target is asked to finish (sampled), for variety beyond
    any template."""
    return [rng.choice(OPENERS) for _ in range(count)]
