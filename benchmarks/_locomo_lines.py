"""What the people of benchmarks/_locomo_like.py say besides their news: greetings, small
talk, reactions, lead-ins and callbacks ({S}: the person talked about or to, {O}: the other
one, {w}: a word of a thread, {p}: the words of an event that its question asks with), and
the multi-hop question of each category of threads."""

from __future__ import annotations

CATEGORY_QUESTIONS = {
    "creative": "What creative hobbies does {S} have?",
    "outdoors": "What outdoor activities has {S} done?",
    "health": "What does {S} do to stay fit and healthy?",
    "pets": "What pets does {S} have?",
    "career": "What steps has {S} taken for a career?",
    "community": "How is {S} involved with the community?",
    "family": "What family milestones has {S} shared?",
    "travel": "Which places has {S} traveled to?",
    "home": "What has {S} been doing around the house?",
}

# The other person, reacting to a topic: the topic's words and the person's name, no answer.
REACTIONS = [
    "Wow, {S}, {w}? That's awesome! How did it feel?",
    "That sounds amazing, {S}! I love hearing about {w}.",
    "No way! I tried {w} once and was terrible at it, haha.",
    "{S}, I'm so glad {w} makes you happy. You deserve it!",
    "Haha, I can't picture it, {S}! Send me pictures of {w}?",
    "That's so cool. What got you into {w} in the first place?",
    "I'm so proud of you, {S}. Keep me posted on {w}!",
    "Oh wow, {w} sounds like a lot. Are you doing okay, {S}?",
]

# The other person picking up the news with its own words ({p}), the teller going on about it,
# and the teller bringing it up again sessions later: turns with the question's words that do
# not answer it.
ECHO_REACTIONS = [
    "Wait, {p}? Wow, {S}, tell me everything!",
    "Oh, {p}! How was it, {S}?",
    "I remember you mentioning {p}, {S}. That's so exciting!",
    "{p}, huh? You never stop surprising me, {S}.",
    "No way, {p}! I'd love to hear more about that.",
]
ECHO_ASIDES = [
    "Yeah, {p} was such a big moment for me.",
    "Honestly, {p} is all I've been thinking about.",
    "I'll send you a photo, {p} deserves one!",
    "Thanks, {O}! {p} really made my month.",
]
ECHO_CALLBACKS = [
    "Remember when I told you about {p}? Still so happy about it.",
    "Funny, I was just thinking about {p} again today.",
    "My friends keep asking me about {p}, haha.",
    "Still can't believe {p} happened, {O}.",
]

# The other person asking about a topic before the news (a lead-in), or in passing.
LEADS = [
    "How's {w} going these days, {S}?",
    "Hey {S}, any news about {w}?",
    "So, what's new with {w}?",
    "I keep thinking about what you said about {w}. Anything new?",
]

GREETINGS = [
    "Hey {O}! Good to see you! How have you been?",
    "Hey {O}, long time no chat! Life has been a whirlwind lately.",
    "Hi {O}! It's been a while, what's new with you?",
    "Hey {O}! I've been meaning to message you all week.",
]
FAREWELLS = [
    "Anyway, I should get going. Talk soon, {O}!",
    "Take care, {O}! Let's catch up again next week.",
    "Bye {O}! Give my love to everyone.",
    "Gotta run, {O}. This was so nice, talk soon!",
]

# Small talk that names no topic (moods, thanks), LoCoMo's usual filler.
FILLER = [
    "Thanks, {O}! That really means a lot to me.",
    "That's so sweet of you to say, {O}. I really appreciate it.",
    "Totally agree, it's so important to take care of yourself.",
    "You're so right. Little moments like that make it all worth it.",
    "I've been swamped with work and family stuff, but hanging in there.",
    "Same here, this week has been a lot. Thanks for checking in!",
    "I love that for you, {O}! You deserve all the good things.",
    "Haha, story of my life. Anyway, what's new with you?",
    "It's been a while! I've missed our chats, {O}.",
    "Honestly, I just need a quiet weekend with my family.",
    "Friends like you make the hard days easier, {O}.",
    "Wow, time flies! It feels like yesterday we talked.",
    "I know what you mean, it's all about balance.",
    "That's such a good way to look at it, {O}.",
    "Thanks for the support, it helps more than you know.",
    "I'm doing alright, just trying to stay positive.",
    "The weather has been so weird lately, rain then sun.",
    "I've been trying to get more sleep, not going great, haha.",
    "We should plan something fun together soon!",
]
