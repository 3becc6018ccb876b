"""Long multi-session conversations with questions whose answers sit in known turns, made up
for benchmarks/retrieval.py (seeded, so every run makes the same ones).

Each conversation is between two people over many dated sessions: mostly small talk (greetings,
moods, plans, reactions, and echoes of the topics talked about, so that a topic's words recur in
turns that answer nothing), with facts said once in one turn, often as the answer to the other
person's question ("Did you go?" — "Yes! We made a bowl."), and some facts completed in a later
session ("Her name is Biscuit, by the way"). Questions are paraphrases: they name the person and
ask with other words than the turn ("Which musical instrument is Maya learning?" against "I
signed up for cello lessons"), as people ask about what was said long ago.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NAMES = [
    ("Caroline", "Melanie"),
    ("Jon", "Gina"),
    ("Maya", "Tomas"),
    ("Priya", "Daniel"),
    ("Leo", "Hannah"),
    ("Sofia", "Marcus"),
    ("Aisha", "Ben"),
    ("Nora", "Victor"),
    ("Kenji", "Laura"),
    ("Elena", "Sam"),
]

SLOTS = {
    "mountain": ["Mount Rainier", "Ben Nevis", "Mount Hood", "Snowdon", "Pikes Peak", "Mont Blanc"],
    "instrument": ["cello", "violin", "saxophone", "piano", "ukulele", "drums", "flute"],
    "dog": ["golden retriever", "beagle", "border collie", "dachshund", "labrador", "corgi"],
    "dogname": ["Biscuit", "Pepper", "Maple", "Rocket", "Juniper", "Waffles", "Ziggy"],
    "city": ["Lisbon", "Kyoto", "Montreal", "Edinburgh", "Barcelona", "Reykjavik", "Prague"],
    "book": ["Dune", "Circe", "The Overstory", "Middlemarch", "Educated", "Piranesi", "Beloved"],
    "dish": ["mushroom risotto", "pad thai", "shakshuka", "lasagna", "ramen", "paella"],
    "sport": ["rock climbing", "fencing", "kayaking", "tennis", "volleyball", "archery"],
    "job": ["nurse", "data analyst", "architect", "teacher", "graphic designer", "paramedic"],
    "org": ["a food bank", "an animal shelter", "a youth center", "a hospice", "a library"],
    "craft": ["pottery", "woodworking", "watercolor painting", "knitting", "glassblowing"],
    "made": ["a bowl and a little mug", "a birdhouse", "a portrait of my grandma", "a scarf"],
    "car": ["a used Subaru", "an electric hatchback", "a vintage Mini", "a pickup truck"],
    "race": ["a half marathon", "a 10k charity run", "a triathlon", "a cycling sprint"],
    "time": ["two hours and ten minutes", "fifty-four minutes", "just under three hours"],
    "plant": ["tomatoes", "basil and mint", "sunflowers", "strawberries", "chili peppers"],
    "show": ["a jazz concert", "a stand-up comedy night", "an opera", "a ballet performance"],
    "course": ["Spanish", "photography", "coding", "sign language", "first aid", "Italian"],
    "kid": ["my son", "my daughter", "my nephew", "my niece"],
    "award": ["employee of the month", "a regional design prize", "a teaching award"],
    "illness": ["a nasty flu", "a sprained ankle", "a broken wrist", "bronchitis"],
    "game": ["chess", "Catan", "Scrabble", "Dungeons and Dragons", "poker"],
    "gift": ["a vintage record player", "a handmade quilt", "concert tickets", "a telescope"],
    "shop": ["a bakery", "a bike repair shop", "an online candle store", "a coffee cart"],
}

# (the other person's lead-in or None, the fact, later completion or None, questions).
# {S}: who the fact is about; {O}: the other person. Questions paraphrase, never quote.
FACTS: list[tuple[str | None, str, str | None, list[str]]] = [
    (
        "How was your weekend, {S}?",
        "Amazing, I went hiking up {mountain} with my sister and we watched the sunrise up top.",
        None,
        [
            "Where did {S} go hiking with a sister?",
            "Which peak did {S} climb with a sibling at dawn?",
        ],
    ),
    (
        None,
        "I finally signed up for {instrument} lessons at the community center, first one is "
        "Thursday.",
        None,
        [
            "Which instrument lessons did {S} sign up for?",
            "What musical instrument is {S} learning to play?",
        ],
    ),
    (
        "Any news at home?",
        "We adopted a {dog} puppy from the rescue last week!",
        "Oh, I never told you, we named the puppy {dogname}.",
        [
            "What breed is the puppy {S} adopted?",
            "What did {S} name the new dog?",
        ],
    ),
    (
        "Where are you off to this summer?",
        "We booked flights to {city} for August, I can't wait to wander the old town.",
        None,
        [
            "Which city did {S} book flights to?",
            "Where is {S} going on vacation in the summer?",
        ],
    ),
    (
        None,
        "I just finished reading {book}, couldn't put it down for three nights straight.",
        None,
        [
            "Which book did {S} finish reading?",
            "What novel kept {S} up for several nights?",
        ],
    ),
    (
        "What did you cook for the party?",
        "I made {dish} from my grandmother's recipe and everyone asked for seconds.",
        None,
        [
            "What did {S} cook from a grandmother's recipe?",
            "Which dish did {S} serve guests at the party?",
        ],
    ),
    (
        None,
        "I've picked up {sport} on Tuesday evenings, my arms are so sore.",
        None,
        [
            "What sport did {S} pick up on Tuesdays?",
            "Which physical activity did {S} take up that makes the arms sore?",
        ],
    ),
    (
        "How's the new job going?",
        "Really well, I started as a {job} at the hospital downtown in March.",
        None,
        [
            "What job did {S} start at the hospital?",
            "What is {S}'s profession now?",
        ],
    ),
    (
        None,
        "Every Saturday morning I volunteer at {org}, it keeps me grounded.",
        None,
        [
            "Where does {S} volunteer on Saturdays?",
            "Where does {S} help out on weekend mornings?",
        ],
    ),
    (
        "Did you end up going to that {craft} workshop?",
        "Yes! I made {made}, it's a bit lopsided but I love it.",
        None,
        [
            "What did {S} make at the workshop?",
            "What was the result of {S}'s craft class?",
        ],
    ),
    (
        None,
        "Big news, we bought {car} so I don't have to take two buses to work anymore.",
        None,
        [
            "What did {S} buy to avoid taking buses to work?",
            "Which vehicle did {S} purchase?",
        ],
    ),
    (
        "How did the race go?",
        "I finished {race} in {time}, a personal best!",
        None,
        [
            "What race did {S} finish with a personal best?",
            "How long did {S} take to complete the event?",
        ],
    ),
    (
        None,
        "My balcony garden is going wild, the {plant} are finally ready to pick.",
        None,
        [
            "What is ready to pick in {S}'s balcony garden?",
            "Which plants is {S} growing at home?",
        ],
    ),
    (
        "What did you do Friday night?",
        "We went to {show} downtown, the atmosphere was electric.",
        None,
        [
            "What did {S} go to downtown on Friday night?",
            "Which live performance did {S} attend?",
        ],
    ),
    (
        None,
        "I enrolled in an evening {course} course, we meet twice a week.",
        None,
        [
            "Which evening course did {S} enroll in?",
            "What subject is {S} studying twice a week?",
        ],
    ),
    (
        "How's the family?",
        "{kid} just started kindergarten and cried at the gate, then loved it.",
        None,
        [
            "Who started kindergarten in {S}'s family?",
            "Which child in {S}'s family had a first day at school?",
        ],
    ),
    (
        None,
        "Guess what, I won {award} this year, I was so surprised.",
        None,
        [
            "What did {S} win this year?",
            "Which honor was {S} given?",
        ],
    ),
    (
        "You sounded tired last time, all okay?",
        "I was stuck in bed with {illness} for almost two weeks.",
        None,
        [
            "What kept {S} in bed for two weeks?",
            "What illness did {S} suffer from?",
        ],
    ),
    (
        None,
        "Our game night is every other Sunday, lately we've been obsessed with {game}.",
        None,
        [
            "What game is {S}'s game night obsessed with?",
            "What do {S} and friends play every other Sunday?",
        ],
    ),
    (
        "What did you get your partner for the anniversary?",
        "I found {gift} and wrapped it in old newspaper.",
        None,
        [
            "What did {S} get a partner for the anniversary?",
            "Which gift did {S} wrap in newspaper?",
        ],
    ),
    (
        None,
        "I'm seriously thinking about opening {shop} next spring, I've saved up enough.",
        "I signed the lease for the shop yesterday, it's happening!",
        [
            "What shop is {S} thinking about opening?",
            "Did {S} sign a lease for the new business?",
        ],
    ),
    (
        "Did your brother ever move?",
        "He moved to {city} in the end, we visit him at Christmas.",
        None,
        [
            "Where did {S}'s brother move?",
            "Which city does {S}'s sibling live in now?",
        ],
    ),
]

SMALL_TALK = [
    "Hey {O}! How have you been?",
    "Good to hear from you, it's been a crazy week.",
    "Haha, same here, work has been nonstop.",
    "That's awesome, I'm so happy for you!",
    "Honestly I just need a long nap this weekend.",
    "Thanks for asking, that means a lot.",
    "Let's catch up properly soon, maybe over coffee?",
    "I know, time flies, it feels like yesterday we talked.",
    "Wow, that sounds like so much fun.",
    "I'm proud of you, seriously.",
    "Same old, same old, nothing exciting on my end.",
    "Ugh, Mondays, right?",
    "The weather has been so weird lately, rain then sun.",
    "I've been trying to get more sleep, not going great.",
    "Talk soon! Give everyone a hug from me.",
    "Totally agree with you on that.",
    "That reminds me, I need to call my mom back.",
    "Yeah, life gets busy but it's good.",
    "I love that for you.",
    "Oh no, that sounds stressful, hang in there.",
]

ECHOES = [
    "I've always wanted to try {topic}, maybe one day.",
    "My cousin is really into {topic} too.",
    "Do you think {topic} is hard for beginners?",
    "There was a documentary about {topic} on TV last night.",
    "Funny, a coworker was just talking about {topic} today.",
    "I read an article about {topic} but forgot most of it.",
]

TOPICS = [
    "hiking",
    "music lessons",
    "dogs",
    "travel",
    "books",
    "cooking",
    "sports",
    "hospitals",
    "volunteering",
    "art classes",
    "cars",
    "running",
    "gardening",
    "concerts",
    "languages",
    "school",
    "awards",
    "being sick",
    "board games",
    "gifts",
    "small businesses",
    "moving house",
]


@dataclass
class Turn:
    id: str  # conversation-session-turn, e.g. c3-s07-t12
    speaker: str
    text: str

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass
class Question:
    text: str
    evidence: list[str]  # turn ids holding the answer
    kind: str = "single-hop"  # LoCoMo's kinds: single-hop, temporal, multi-hop, open-domain


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)  # each session's date (locomo-like data)


def _fill(text: str, slots: dict[str, str], s: str, o: str) -> str:
    out = text.replace("{S}", s).replace("{O}", o)
    for k, v in slots.items():
        out = out.replace("{" + k + "}", v)
    return out[0].upper() + out[1:]


def make(conversations: int = 10, turns_per: int = 600, seed: int = 7) -> list[Conversation]:
    """`conversations` of about `turns_per` turns each, every fact of FACTS told once in each
    (by one of the two, at a random session), two questions per fact."""
    rnd = random.Random(seed)
    out = []
    for c in range(conversations):
        a, b = NAMES[c % len(NAMES)]
        sessions = max(4, turns_per // 30)
        slots = {k: rnd.choice(v) for k, v in SLOTS.items()}
        plan: dict[int, list[tuple]] = {}
        for fact in FACTS:
            subject = rnd.choice((a, b))
            at = rnd.randrange(sessions - 2)
            plan.setdefault(at, []).append(("fact", fact, subject))
            if fact[2] is not None:
                plan.setdefault(rnd.randrange(at + 1, sessions), []).append(
                    ("later", fact, subject)
                )
        conv = Conversation()
        told: dict[tuple[int, int], list[str]] = {}  # (fact index, part) -> turn ids
        for s_no in range(sessions):
            items = plan.get(s_no, [])
            size = turns_per // sessions
            slots_at = sorted(rnd.sample(range(2, max(size - 1, len(items) + 3)), len(items)))
            speaker = rnd.choice((a, b))
            prefix = f"c{c}-s{s_no:02d}"
            first_turn = len(conv.turns)

            def add(who: str, text: str, conv=conv, prefix=prefix, first=first_turn) -> str:
                turn = Turn(id=f"{prefix}-t{len(conv.turns) - first:02d}", speaker=who, text=text)
                conv.turns.append(turn)
                return turn.id

            for k in range(size):
                if items and slots_at and k == slots_at[0]:
                    slots_at.pop(0)
                    kind, fact, subject = items.pop(0)
                    other = b if subject == a else a
                    lead, statement, later, _ = fact
                    index = FACTS.index(fact)
                    if kind == "fact":
                        if lead is not None:
                            add(other, _fill(lead, slots, subject, other))
                        told[(index, 0)] = [add(subject, _fill(statement, slots, subject, other))]
                    else:
                        told[(index, 1)] = [add(subject, _fill(later, slots, subject, other))]
                    continue
                who = speaker if k % 2 == 0 else (b if speaker == a else a)
                other = b if who == a else a
                if rnd.random() < 0.3:
                    text = rnd.choice(ECHOES).replace("{topic}", rnd.choice(TOPICS))
                else:
                    text = _fill(rnd.choice(SMALL_TALK), {}, who, other)
                add(who, text)
        for index, fact in enumerate(FACTS):
            first = told.get((index, 0))
            if first is None:
                continue
            subject = next(tr.speaker for tr in conv.turns if tr.id == first[0])
            other = b if subject == a else a
            questions = fact[3]
            for q_no, q in enumerate(questions):
                evidence = list(first)
                # The second question of a fact completed later is answered by that turn.
                if q_no == 1 and fact[2] is not None and (index, 1) in told:
                    evidence = told[(index, 1)]
                conv.questions.append(Question(_fill(q, slots, subject, other), evidence))
        out.append(conv)
    return out
