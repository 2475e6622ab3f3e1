"""Open chat questions for self-distillation: the kind of thing people ask an assistant.

The machine's text (man pages, gettext messages, the standard library) yields technical prompts;
open chat needs everyday questions too. The topics of the benchmark's chat prompts
(`specdec.prompts.CHAT_QUESTIONS`) are left out, so those stay unseen by this data. They are built
from short topic lists and question templates that fit each list, seeded, so several thousand
distinct prompts come from a page of text.
"""

from __future__ import annotations

import random

MECHANISMS = [
    "a microwave oven", "a bicycle gear", "a solar panel", "a wind turbine", "an electric motor",
    "a battery", "a smartphone touchscreen", "GPS navigation", "a compass", "a thermostat", "an airplane wing",
    "a submarine", "a rocket engine", "a nuclear power plant", "a heat pump", "a camera lens", "a printer",
    "Wi-Fi", "a search engine", "email", "a credit card payment", "the human heart",
    "the human eye", "the immune system", "memory in the brain", "digestion", "a rainbow", "the tides",
    "an earthquake", "a volcano", "a hurricane", "lightning", "the greenhouse effect", "a compiler",
    "a database index", "public-key encryption", "a blockchain", "a hash function", "garbage collection",
    "a web browser", "the internet", "a 3D printer", "an elevator", "a lock and key", "a clock",
    "a thermometer", "a hearing aid", "an electric car", "a traffic light system", "a water filter",
]

CONCEPTS = [
    "supply and demand", "democracy", "the scientific method", "evolution",
    "gravity", "energy conservation", "entropy", "probability", "statistics",
    "object-oriented programming", "version control", "machine learning", "a neural network", "an algorithm",
    "big O notation", "an operating system", "a file system", "a virtual machine", "cloud computing",
    "open-source software", "climate change", "biodiversity", "the carbon cycle", "plate tectonics",
    "the solar system", "the speed of light", "DNA", "genes", "antibiotics", "nutrition",
    "stress", "mindfulness", "time management", "critical thinking", "opportunity cost",
    "a budget", "a mortgage", "insurance", "taxes", "renewable energy", "recycling", "a healthy diet",
    "the Roman Empire", "the Industrial Revolution", "the printing press", "the Renaissance", "a constitution",
    "human rights", "a free market", "globalisation", "a pandemic", "the placebo effect", "a prime number",
    "fractions", "the Pythagorean theorem", "a function in mathematics", "an encyclopedia", "a library",
]

ACTIVITIES = [
    "learning a new language", "running a first marathon", "cooking rice", "baking bread", "growing tomatoes",
    "keeping houseplants alive", "saving money", "writing a CV", "giving a presentation", "studying for exams",
    "learning to program", "writing unit tests", "reviewing code", "debugging a program", "planning a trip",
    "packing for a long flight", "moving to a new city", "starting a small business", "negotiating a salary",
    "making friends as an adult", "taking better photos", "learning to draw", "playing chess", "reading more books",
    "sleeping better", "drinking enough water", "starting to exercise", "cycling to work", "camping in the rain",
    "organising a birthday party", "cleaning a kitchen", "reducing screen time", "writing a cover letter",
    "managing a team", "running a meeting", "teaching a child to read", "caring for a dog", "adopting a cat",
    "making coffee", "brewing tea", "learning the piano", "speaking in public", "writing a short story",
    "keeping a journal", "setting goals", "staying focused while working from home", "backing up a computer",
    "choosing a password", "buying a used car", "painting a room",
]

SUBJECTS = [
    "a lighthouse keeper", "a city at night", "a lost umbrella", "the first snow",
    "a robot who learns to cook", "a cat who wants to fly", "an old library", "a train journey", "the moon",
    "a forest after rain", "a friendship between a fox and a crow", "a mountain village", "a busy market",
    "a child's first day at school", "a clock that runs backwards", "a garden in spring", "a dragon who is afraid of fire",
    "the last day of summer", "a message in a bottle", "a quiet morning", "a thunderstorm", "a long-lost letter",
    "an astronaut looking at Earth", "a baker who gets up at four", "a bridge", "a river", "the desert at night",
]

PAIRS = [
    ("RAM", "storage"), ("a list", "a tuple in Python"), ("speed", "velocity"), ("mass", "weight"),
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a debit card", "a credit card"),
    ("an interpreter", "a compiler"), ("HTTP", "HTTPS"), ("a loan", "a lease"), ("stocks", "bonds"),
    ("a comet", "an asteroid"), ("a lake", "a pond"), ("empathy", "sympathy"), ("a meteor", "a meteorite"),
    ("a hypothesis", "a theory"), ("SQL", "NoSQL databases"), ("a library", "a framework"),
    ("latency", "bandwidth"), ("a recession", "a depression"), ("a fruit", "a vegetable"),
    ("a city", "a town"), ("an ocean", "a sea"), ("a frog", "a toad"), ("a violin", "a viola"), ("git merge", "git rebase"),
]

TEMPLATES = [
    (MECHANISMS, ["How does {} work?", "Explain how {} works to a ten-year-old.", "What are the main parts of {}?",
                  "Why is {} useful, and what are its limits?"]),
    (CONCEPTS, ["Explain {} in simple words.", "What is {} and why does it matter?", "Give me three facts about {}.",
                "What is a common misunderstanding about {}?", "Explain {} using an everyday analogy."]),
    (ACTIVITIES, ["What are some tips for {}?", "Give me a short plan for {}.", "What mistakes do beginners make when {}?",
                  "How can I get better at {}?", "What should I know before {}?"]),
    (SUBJECTS, ["Write a short poem about {}.", "Tell me a short story about {}.", "Describe {} in a few sentences.",
                "Write a haiku about {}."]),
]


def open_questions(count: int, seed: int = 0, exclude: set[str] | frozenset = frozenset()) -> list[str]:
    """`count` distinct everyday questions (fewer if the lists run out), seeded; none in `exclude`."""
    rng = random.Random(f"open-questions:{seed}")
    pool = {template.format(topic) for topics, templates in TEMPLATES for topic in topics for template in templates}
    pool |= {template.format(a, b) for a, b in PAIRS
             for template in ("What is the difference between {} and {}?", "When should I choose {} over {}?")}
    questions = sorted(pool - set(exclude))
    rng.shuffle(questions)
    return questions[:count]
