"""Open chat questions for self-distillation: the kind of thing people ask an assistant.

The machine's text (man pages, gettext messages, the standard library) yields technical prompts;
open chat needs everyday questions too. The topics of the benchmark's chat prompts
(`specdec.tasks.prompts.CHAT_QUESTIONS`) are left out, so those stay unseen by this data. They are built
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
    "a dishwasher", "a washing machine", "an induction hob", "a pressure cooker", "a vacuum cleaner", "a light bulb",
    "an LED", "a transistor", "a microchip", "a hard drive", "a solid-state drive", "a keyboard", "a computer mouse",
    "a loudspeaker", "a microphone", "a radio", "television", "a satellite", "the International Space Station",
    "a telescope", "a microscope", "an X-ray machine", "an MRI scanner", "a pacemaker", "insulin", "a parachute",
    "a hot air balloon", "a helicopter", "a sailboat", "a canal lock", "a dam", "a steam engine", "a diesel engine",
    "a car's brakes", "an airbag", "cruise control", "a zipper", "a sewing machine", "a piano", "a guitar amplifier",
    "a barcode scanner", "a QR code", "contactless payment", "a spam filter", "a recommendation system",
    "a video call", "streaming video", "a router", "a firewall", "a password manager", "two-factor authentication",
    "the stock exchange", "a central bank", "a vaccine trial", "a fire extinguisher", "a smoke detector",
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
    "inflation-adjusted wages", "unemployment", "a trade deficit", "interest rates", "a cryptocurrency",
    "the water table", "erosion", "the nitrogen cycle", "an ecosystem",
    "a food chain", "migration of birds", "hibernation", "the ozone layer", "air pressure", "magnetism",
    "electric current", "sound waves", "friction", "inertia", "momentum", "density", "buoyancy", "temperature",
    "atoms", "molecules", "chemical reactions", "acids and bases", "the periodic table", "radioactivity",
    "the Big Bang", "a galaxy", "a star's life cycle", "dark matter", "relativity", "quantum mechanics",
    "logic", "ethics", "free will", "happiness", "motivation", "habits", "procrastination", "creativity",
    "curiosity", "leadership", "teamwork", "communication", "feedback", "negotiation", "marketing", "branding",
    "a start-up", "a cooperative", "a union", "the welfare state", "public transport", "urban planning",
    "the Silk Road", "the Cold War", "the French Revolution", "ancient Egypt", "the Vikings", "the Moon landing",
    "the invention of the telephone", "the history of writing", "the Olympic Games", "jazz", "impressionism",
    "poetry", "a novel", "a symphony", "philosophy", "linguistics", "a dialect", "translation", "grammar",
    "a linked list", "a binary search", "sorting", "a queue", "a stack", "a graph",
    "encryption", "compression", "caching", "concurrency", "testing software", "refactoring", "documentation",
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
    "learning to swim", "hiking in the mountains", "riding a bicycle in the city", "learning to juggle",
    "knitting a scarf", "repairing a flat tyre", "fixing a leaking tap", "assembling furniture", "hanging a picture",
    "decorating a small flat", "decluttering a wardrobe", "planning meals for a week", "shopping on a budget",
    "cooking pasta", "making pancakes", "making a salad", "grilling vegetables", "baking a cake",
    "preparing for a long drive", "travelling by train", "learning to ski", "starting to run", "doing yoga",
    "stretching after exercise", "meditating", "dealing with stress at work",
    "asking for a promotion", "changing careers", "working in a team", "writing a report", "taking notes in class",
    "learning mathematics", "memorising vocabulary", "preparing a speech", "writing a blog", "starting a podcast",
    "editing a video", "recording music", "singing in a choir", "learning to dance",
    "volunteering", "hosting a dinner", "writing a thank-you note", "apologising to a friend", "raising a puppy",
    "keeping chickens", "composting", "saving energy at home", "insulating a house", "choosing a bicycle",
    "learning a programming language", "using a spreadsheet", "writing a good commit message", "learning SQL",
    "setting up a home network", "protecting privacy online", "spotting a phishing email", "building a website",
]

SUBJECTS = [
    "a lighthouse keeper", "a city at night", "a lost umbrella", "the first snow",
    "a robot who learns to cook", "a cat who wants to fly", "an old library", "a train journey", "the moon",
    "a forest after rain", "a friendship between a fox and a crow", "a mountain village", "a busy market",
    "a child's first day at school", "a clock that runs backwards", "a garden in spring", "a dragon who is afraid of fire",
    "the last day of summer", "a message in a bottle", "a quiet morning", "a thunderstorm", "a long-lost letter",
    "an astronaut looking at Earth", "a baker who gets up at four", "a bridge", "a river", "the desert at night",
    "an old fisherman", "a snowman who does not want to melt", "a tiny island", "a haunted house", "a treasure map",
    "a city in the year 3000", "a talking tree", "the first day of spring", "a rainy afternoon", "a night train",
    "a shy giant", "a lost kitten", "a kite on a windy day", "a small bakery", "a pirate who cannot swim",
    "a musician on the street", "an empty stadium", "a wise owl", "a field of sunflowers", "a sailor's farewell",
    "a candle in the dark", "the sound of the ocean", "a grandmother's kitchen", "a door that leads anywhere",
    "a detective in the rain", "a penguin on holiday", "the autumn wind", "a bird learning to fly",
]

PAIRS = [
    ("RAM", "storage"), ("a list", "a tuple in Python"), ("speed", "velocity"), ("mass", "weight"),
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a debit card", "a credit card"),
    ("an interpreter", "a compiler"), ("HTTP", "HTTPS"), ("a loan", "a lease"), ("stocks", "bonds"),
    ("a comet", "an asteroid"), ("a lake", "a pond"), ("empathy", "sympathy"), ("a meteor", "a meteorite"),
    ("a hypothesis", "a theory"), ("SQL", "NoSQL databases"), ("a library", "a framework"),
    ("latency", "bandwidth"), ("a recession", "a depression"), ("a fruit", "a vegetable"),
    ("a city", "a town"), ("an ocean", "a sea"), ("a frog", "a toad"), ("a violin", "a viola"), ("git merge", "git rebase"),
    ("weather", "a forecast"), ("a planet", "a star"), ("a moth", "a butterfly"), ("a rabbit", "a hare"),
    ("a cold", "the flu"), ("an allergy", "an intolerance"), ("a symptom", "a disease"), ("a nurse", "a doctor"),
    ("a wage", "a salary"), ("saving", "investing"), ("renting", "buying a home"), ("a sprint", "a marathon"),
    ("jogging", "running"), ("a lecture", "a seminar"), ("a novel", "a short story"), ("a poem", "a song"),
    ("a laptop", "a desktop computer"), ("a tablet", "a laptop"), ("Linux", "Windows"), ("Python", "JavaScript"),
    ("a class", "an object"), ("a variable", "a constant"), ("a bug", "a feature"), ("unit tests", "integration tests"),
    ("a monarchy", "a republic"), ("a law", "a regulation"), ("an opinion", "a fact"), ("a tornado", "a hurricane"),
]

TEMPLATES = [
    (MECHANISMS, ["How does {} work?", "Explain how {} works to a ten-year-old.", "What are the main parts of {}?",
                  "Why is {} useful, and what are its limits?", "Who invented {}, and how has it changed?",
                  "What can go wrong with {}?", "Describe step by step what happens inside {}."]),
    (CONCEPTS, ["Explain {} in simple words.", "What is {} and why does it matter?", "Give me three facts about {}.",
                "What is a common misunderstanding about {}?", "Explain {} using an everyday analogy.",
                "How would you teach {} to a beginner?", "Write a short paragraph about {}."]),
    (ACTIVITIES, ["What are some tips for {}?", "Give me a short plan for {}.", "What mistakes do beginners make when {}?",
                  "How can I get better at {}?", "What should I know before {}?", "What do I need for {}?",
                  "Give me a checklist for {}."]),
    (SUBJECTS, ["Write a short poem about {}.", "Tell me a short story about {}.", "Describe {} in a few sentences.",
                "Write a haiku about {}.", "Write the opening paragraph of a story about {}."]),
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
