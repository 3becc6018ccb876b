"""The life threads of benchmarks/_locomo_like.py: what the people of a LoCoMo-like conversation
talk about, session after session.

A theme is one thread of a person's life (pottery, a rescue dog, a new job …): its words (which
the other person's reactions, the person's own asides and the small talk reuse, so that most
turns that mention a topic answer nothing), three events told in different sessions (each one
turn with a relative time such as "last Friday", never a date) with a fact question and a
"when" question each, and an inference question whose words barely meet the turn's. `{S}` is
the person, `{O}` the other one, `{when}` a relative time; other `{slot}`s are drawn per person
from SLOTS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    say: str  # the turn that holds the answer
    fact: str  # a question about what happened (single hop)
    when: str  # a question about when it happened (temporal; the turn has no date)


@dataclass(frozen=True)
class Theme:
    key: str
    cat: str  # themes of one category make multi-hop questions (CATEGORY_QUESTIONS)
    words: tuple[str, ...]  # how others refer to it ("your pottery", "the clay")
    events: tuple[Event, ...]
    asides: tuple[str, ...]  # the person on the topic, answering nothing
    infer: str  # an open-domain question answered by the first event's turn


WHEN = [
    "yesterday",
    "last weekend",
    "last Friday",
    "a couple of days ago",
    "last week",
    "on Sunday",
    "two weeks ago",
    "last month",
]

SLOTS = {
    "pot": ["a little blue bowl", "a lopsided mug", "a flower vase", "a set of tiny plates"],
    "color": ["deep teal", "speckled white", "rusty orange", "glossy green"],
    "paint": ["a lake at sunrise", "my grandma's garden", "a field of sunflowers", "a stormy sea"],
    "gallery": ["the library cafe", "a local gallery", "the town hall", "an art fair"],
    "instrument": ["violin", "guitar", "piano", "cello", "clarinet"],
    "song": ["Moonlight Sonata", "Clair de Lune", "a Beatles medley", "Hallelujah"],
    "dog": ["golden retriever", "beagle", "border collie", "labrador", "corgi"],
    "dogname": ["Biscuit", "Pepper", "Maple", "Rocket", "Juniper", "Ziggy"],
    "cat": ["tabby", "black", "ginger", "Siamese"],
    "catname": ["Luna", "Oliver", "Mochi", "Shadow", "Bean"],
    "park": ["Yosemite", "the Smoky Mountains", "Banff", "Lake Tahoe", "the Olympic forest"],
    "peak": ["Mount Hood", "Pikes Peak", "Mount Rainier", "Ben Nevis"],
    "race": ["a 5k for mental health", "a half marathon", "a charity fun run", "a 10k"],
    "city": ["Lisbon", "Kyoto", "Montreal", "Edinburgh", "Barcelona", "Prague", "Seoul"],
    "city2": ["Vienna", "Dublin", "Mexico City", "Copenhagen", "Istanbul", "Athens"],
    "job": ["nurse", "data analyst", "architect", "teacher", "graphic designer", "social worker"],
    "field": ["counseling", "psychology", "marine biology", "nursing", "accounting"],
    "org": ["an animal shelter", "a food bank", "a youth center", "a homeless shelter"],
    "kid": ["my son", "my daughter", "my youngest", "my oldest"],
    "kidthing": ["dinosaurs", "space and planets", "drawing horses", "building Lego castles"],
    "dish": ["mushroom risotto", "pad thai", "shakshuka", "lasagna", "chicken curry"],
    "bake": ["sourdough", "banana bread", "cinnamon rolls", "a lemon tart"],
    "plant": ["tomatoes", "basil", "sunflowers", "strawberries", "chili peppers"],
    "book": ["Dune", "Circe", "The Overstory", "Educated", "Becoming", "Piranesi"],
    "game": ["chess", "Catan", "Scrabble", "poker"],
    "sport": ["tennis", "volleyball", "basketball", "soccer"],
    "shop": ["a bakery", "a bike repair shop", "an online candle store", "a coffee cart"],
    "neigh": ["across town", "near the river", "closer to work", "by the beach"],
    "gift": ["a necklace", "a record player", "concert tickets", "a handmade quilt"],
    "pose": ["crow pose", "a headstand", "the splits", "wheel pose"],
    "injury": ["a sprained ankle", "a broken wrist", "a pulled back muscle"],
    "lang": ["Spanish", "Japanese", "French", "Italian", "sign language"],
}

THEMES: list[Theme] = [
    Theme(
        "pottery",
        "creative",
        ("pottery", "the clay", "the pottery class", "the wheel"),
        (
            Event(
                "I took my first pottery class {when} and made {pot}. Messy, but I'm weirdly "
                "proud of it!",
                "What did {S} make in the first pottery class?",
                "When did {S} take a first pottery class?",
            ),
            Event(
                "The kiln finally fired my vase {when} and the glaze came out {color}, I "
                "almost cried.",
                "What color did the glaze on {S}'s vase turn out?",
                "When did {S}'s vase come out of the kiln?",
            ),
            Event(
                "I signed up to teach a kids' pottery workshop at the community center {when}.",
                "What kind of workshop did {S} sign up to teach?",
                "When did {S} agree to teach kids pottery?",
            ),
        ),
        (
            "Working with clay just calms my mind, you know?",
            "Pottery is my therapy now, I lose track of time at the wheel.",
            "My hands were covered in clay for hours, haha.",
        ),
        "Would {S} enjoy a ceramics exhibition?",
    ),
    Theme(
        "painting",
        "creative",
        ("painting", "your paintings", "the canvas", "art"),
        (
            Event(
                "I painted {paint} {when}, it's the first piece I've wanted to hang up.",
                "What did {S} paint that is worth hanging up?",
                "When did {S} paint the piece for the wall?",
            ),
            Event(
                "Two of my paintings got picked for a show at {gallery} {when}!",
                "Where were {S}'s paintings shown?",
                "When were {S}'s paintings picked for a show?",
            ),
            Event(
                "I started an online watercolor course {when} to work on my skies.",
                "What course did {S} start to improve painting skies?",
                "When did {S} begin the watercolor course?",
            ),
        ),
        (
            "Painting is how I sort out my feelings, honestly.",
            "I have paint on every shirt I own at this point.",
            "Art has always been my way of expressing myself.",
        ),
        "Is {S} someone who likes visual arts?",
    ),
    Theme(
        "music",
        "creative",
        ("music", "your playing", "the lessons", "practice"),
        (
            Event(
                "I started {instrument} lessons {when}, my teacher says I have good rhythm.",
                "Which instrument is {S} taking lessons for?",
                "When did {S} start music lessons?",
            ),
            Event(
                "I played {song} at my cousin's wedding {when}, my hands were shaking!",
                "What piece did {S} perform at the cousin's wedding?",
                "When did {S} play music at a wedding?",
            ),
            Event(
                "I joined a community orchestra {when}, we rehearse on Wednesdays.",
                "What musical group did {S} join?",
                "When did {S} join the orchestra?",
            ),
        ),
        (
            "Music has been my escape since I was a kid.",
            "I practice every night after dinner, the neighbors must love me, haha.",
            "Playing music makes everything else go quiet for a while.",
        ),
        "Would {S} likely go to a classical concert?",
    ),
    Theme(
        "camping",
        "outdoors",
        ("camping", "the trip", "the outdoors", "the tent"),
        (
            Event(
                "We went camping in {park} {when} with the kids, we roasted marshmallows and "
                "saw shooting stars.",
                "Where did {S} go camping with the kids?",
                "When did {S} go camping with family?",
            ),
            Event(
                "Our tent flooded in a storm {when}, so we slept in the car, what a night.",
                "Why did {S}'s family sleep in the car on a camping trip?",
                "When did {S}'s tent get flooded?",
            ),
            Event(
                "I booked a campsite by the lake for July {when}, the kids are counting days.",
                "What did {S} book for July?",
                "When did {S} reserve the lakeside campsite?",
            ),
        ),
        (
            "Nothing beats waking up in a tent to birds singing.",
            "Being out in nature just recharges me.",
            "The kids love the outdoors as much as I do.",
        ),
        "Does {S} enjoy spending time in nature?",
    ),
    Theme(
        "hiking",
        "outdoors",
        ("hiking", "the hike", "the trail", "the mountains"),
        (
            Event(
                "I hiked up {peak} {when}, six hours round trip, and the view was unreal.",
                "Which mountain did {S} hike?",
                "When did {S} hike the mountain?",
            ),
            Event(
                "I got lost on a trail {when} and a park ranger helped me find my way back.",
                "Who helped {S} after getting lost?",
                "When did {S} get lost on a trail?",
            ),
            Event(
                "I bought proper hiking boots {when}, no more blisters I hope.",
                "What gear did {S} buy to avoid blisters?",
                "When did {S} buy new boots?",
            ),
        ),
        (
            "Hiking clears my head like nothing else.",
            "My legs are still sore from the trail, haha.",
            "I want to do a big mountain every season.",
        ),
        "Would {S} like a vacation in the Alps?",
    ),
    Theme(
        "running",
        "health",
        ("running", "the race", "your training", "the run"),
        (
            Event(
                "I ran {race} {when}, it was really rewarding and I finished without walking.",
                "What race did {S} run?",
                "When did {S} run the race?",
            ),
            Event(
                "I joined a running club {when}, we meet at 6am by the river.",
                "What group did {S} join to train?",
                "When did {S} join the running club?",
            ),
            Event(
                "I hurt my knee on a run {when}, so I'm taking a break from training.",
                "Why is {S} taking a break from training?",
                "When did {S} get hurt running?",
            ),
        ),
        (
            "Running is how I handle stress these days.",
            "I love the feeling after a long run, so peaceful.",
            "I'm trying to run three times a week.",
        ),
        "Does {S} care about physical fitness?",
    ),
    Theme(
        "yoga",
        "health",
        ("yoga", "the yoga class", "the studio", "meditation"),
        (
            Event(
                "I finally nailed {pose} in yoga {when}, after months of falling over!",
                "What yoga pose did {S} manage to do?",
                "When did {S} nail the yoga pose?",
            ),
            Event(
                "I started meditating every morning {when}, just ten minutes, and I sleep so "
                "much better.",
                "What morning habit helps {S} sleep better?",
                "When did {S} start meditating?",
            ),
            Event(
                "I signed up for a yoga teacher training {when}, it's 200 hours!",
                "What training did {S} sign up for?",
                "When did {S} sign up for teacher training?",
            ),
        ),
        (
            "Yoga keeps me sane, I swear.",
            "The studio is my happy place.",
            "Breathing exercises really help when work gets crazy.",
        ),
        "Is {S} into mindfulness practices?",
    ),
    Theme(
        "dog",
        "pets",
        ("the dog", "your pup", "the puppy", "walks"),
        (
            Event(
                "We adopted a {dog} from the rescue {when}, we named her {dogname}!",
                "What breed of dog did {S} adopt?",
                "When did {S} adopt the dog?",
            ),
            Event(
                "{dogname} ate one of my shoes {when}, and then looked so proud of herself.",
                "What did {S}'s dog chew up?",
                "When did {S}'s dog eat a shoe?",
            ),
            Event(
                "{dogname} graduated from obedience school {when}, she can finally sit and stay.",
                "What school did {S}'s dog finish?",
                "When did {S}'s dog graduate?",
            ),
        ),
        (
            "Dogs just make everything better, right?",
            "Our walks in the park are the best part of my day.",
            "She sleeps at the foot of my bed every night.",
        ),
        "Would {S} be considered an animal lover?",
    ),
    Theme(
        "cat",
        "pets",
        ("the cat", "your kitty", "the kitten", "the vet"),
        (
            Event(
                "We brought home a {cat} kitten {when}, his name is {catname}.",
                "What is the name of {S}'s kitten?",
                "When did {S} bring home a kitten?",
            ),
            Event(
                "{catname} had surgery at the vet {when}, he's recovering on the couch.",
                "Why was {S}'s cat at the vet?",
                "When did {S}'s cat have surgery?",
            ),
            Event(
                "{catname} knocked my coffee onto my laptop {when}, RIP laptop.",
                "What did {S}'s cat break?",
                "When did {S}'s cat ruin the laptop?",
            ),
        ),
        (
            "Cats are such little characters, honestly.",
            "He purrs on my lap while I work from home.",
            "Pets are family, no question.",
        ),
        "Does {S} have a pet at home?",
    ),
    Theme(
        "career",
        "career",
        ("work", "the new job", "your career", "the interview"),
        (
            Event(
                "I got the job as a {job} {when}! I start on the first of the month.",
                "What job did {S} get?",
                "When did {S} get the new job?",
            ),
            Event(
                "My boss put me in charge of a new project {when}, a bit scary but exciting.",
                "What was {S} put in charge of at work?",
                "When did {S} get a new project at work?",
            ),
            Event(
                "I handed in my notice at my old job {when}, it felt so freeing.",
                "What did {S} do at the old job?",
                "When did {S} quit the old job?",
            ),
        ),
        (
            "Work has been nonstop but I'm learning so much.",
            "I'm trying to keep a better work-life balance.",
            "My coworkers are honestly the best part of the job.",
        ),
        "Is {S} ambitious about work?",
    ),
    Theme(
        "school",
        "career",
        ("school", "your studies", "classes", "the degree"),
        (
            Event(
                "I enrolled in a {field} program {when}, I want to help people who struggle like "
                "I did.",
                "What did {S} decide to study?",
                "When did {S} enroll in the program?",
            ),
            Event(
                "I aced my statistics exam {when}, all those late nights paid off!",
                "Which exam did {S} ace?",
                "When did {S} pass the statistics exam?",
            ),
            Event(
                "I got accepted into an internship at a clinic {when}.",
                "Where is {S}'s internship?",
                "When was {S} accepted for an internship?",
            ),
        ),
        (
            "Studying while working is exhausting but worth it.",
            "Education has always mattered to me.",
            "My classmates are such an inspiring bunch.",
        ),
        "What career path might {S} pursue?",
    ),
    Theme(
        "volunteer",
        "community",
        ("volunteering", "the shelter", "helping out", "the community"),
        (
            Event(
                "I started volunteering at {org} {when}, every Saturday morning.",
                "Where does {S} volunteer?",
                "When did {S} start volunteering?",
            ),
            Event(
                "We organized a fundraiser for the shelter {when} and raised over three "
                "thousand dollars!",
                "How much did {S}'s fundraiser raise?",
                "When did {S} organize the fundraiser?",
            ),
            Event(
                "I gave a talk at a high school about my volunteer work {when}.",
                "Where did {S} give a talk?",
                "When did {S} speak at a school?",
            ),
        ),
        (
            "Giving back is so important to me.",
            "Helping others makes me feel like I'm doing something that matters.",
            "The people at the shelter have such inspiring stories.",
        ),
        "Would {S} be likely to donate to charity?",
    ),
    Theme(
        "support",
        "community",
        ("the support group", "the group", "the meetings", "the community"),
        (
            Event(
                "I went to a support group for people going through divorce {when}, it was so "
                "powerful.",
                "What kind of support group did {S} attend?",
                "When did {S} go to the support group?",
            ),
            Event(
                "I shared my own story at the group {when} for the first time, everyone hugged "
                "me after.",
                "What did {S} do for the first time at the group?",
                "When did {S} share a personal story?",
            ),
            Event(
                "I marched in the pride parade {when}, the energy was incredible.",
                "What parade did {S} march in?",
                "When did {S} go to the parade?",
            ),
        ),
        (
            "Having people who understand you makes such a difference.",
            "I feel so accepted there, it gives me courage.",
            "Community support got me through the hardest year.",
        ),
        "Has {S} been through a hard time emotionally?",
    ),
    Theme(
        "kids",
        "family",
        ("the kids", "your little ones", "family time", "parenting"),
        (
            Event(
                "{kid} is obsessed with {kidthing} right now, it's all we talk about at dinner.",
                "What are {S}'s kids into lately?",
                "When did {S}'s kid get into a new obsession?",
            ),
            Event(
                "{kid} lost a first tooth {when} and left a note for the tooth fairy.",
                "What did {S}'s child leave for the tooth fairy?",
                "When did {S}'s child lose a tooth?",
            ),
            Event(
                "We took the kids to the science museum {when}, they loved the planetarium.",
                "What did {S}'s kids love at the museum?",
                "When did {S} take the kids to the museum?",
            ),
        ),
        (
            "Kids keep you on your toes, that's for sure.",
            "Family time is everything to me.",
            "Parenting is the hardest and best job there is.",
        ),
        "Is {S} a parent?",
    ),
    Theme(
        "wedding",
        "family",
        ("the wedding", "your partner", "the engagement", "the anniversary"),
        (
            Event(
                "My partner proposed {when} on the beach at sunset, I said yes!",
                "Where did {S}'s partner propose?",
                "When did {S} get engaged?",
            ),
            Event(
                "For our anniversary {when} I got my partner {gift}.",
                "What did {S} give as an anniversary present?",
                "When was {S}'s anniversary?",
            ),
            Event(
                "We picked a venue for the wedding {when}, an old barn with fairy lights.",
                "What venue did {S} choose for the wedding?",
                "When did {S} choose the wedding venue?",
            ),
        ),
        (
            "Planning a wedding is a full-time job, haha.",
            "I'm so lucky to have such a supportive partner.",
            "We've been together for five years now.",
        ),
        "Is {S} in a committed relationship?",
    ),
    Theme(
        "travel",
        "travel",
        ("the trip", "traveling", "your vacation", "the flight"),
        (
            Event(
                "We just got back from {city} {when}, the food and the old streets were amazing.",
                "Which city did {S} just visit?",
                "When did {S} get back from the trip?",
            ),
            Event(
                "I booked a solo trip to {city2} {when}, my first time traveling alone!",
                "Where is {S}'s solo trip to?",
                "When did {S} book the solo trip?",
            ),
            Event(
                "Our flight home was cancelled {when} and we spent the night at the airport.",
                "Where did {S} have to spend the night after a cancellation?",
                "When was {S}'s flight cancelled?",
            ),
        ),
        (
            "Traveling opens my eyes every single time.",
            "I'm already dreaming about the next vacation.",
            "Jet lag is brutal but so worth it.",
        ),
        "Has {S} been abroad?",
    ),
    Theme(
        "cooking",
        "home",
        ("cooking", "the recipe", "the kitchen", "dinner"),
        (
            Event(
                "I made {dish} for my parents {when} and my dad asked for the recipe!",
                "What dish did {S} cook for the parents?",
                "When did {S} cook for the parents?",
            ),
            Event(
                "I've been baking {bake} every weekend since {when}, the house smells amazing.",
                "What has {S} been baking?",
                "When did {S} start baking on weekends?",
            ),
            Event(
                "I signed up for a cooking class on Thai food {when}.",
                "What cuisine is {S}'s cooking class about?",
                "When did {S} sign up for a cooking class?",
            ),
        ),
        (
            "Cooking is my way of showing people I love them.",
            "The kitchen is a disaster but dinner was good, haha.",
            "I love trying new recipes on the weekend.",
        ),
        "Does {S} like to cook?",
    ),
    Theme(
        "garden",
        "home",
        ("the garden", "gardening", "your plants", "the backyard"),
        (
            Event(
                "The {plant} in my garden are finally ready {when}, so much harvest!",
                "What is ready to harvest in {S}'s garden?",
                "When was {S}'s harvest ready?",
            ),
            Event(
                "I built raised beds in the backyard {when} with my neighbor's help.",
                "What did {S} build in the backyard?",
                "When did {S} build raised beds?",
            ),
            Event(
                "A storm knocked over my greenhouse {when}, I was heartbroken.",
                "What did a storm destroy at {S}'s place?",
                "When did {S}'s greenhouse get knocked over?",
            ),
        ),
        (
            "Gardening is so grounding, hands in the dirt.",
            "My plants are basically my children at this point.",
            "There's nothing like eating something you grew yourself.",
        ),
        "Would {S} enjoy visiting a botanical garden?",
    ),
    Theme(
        "moving",
        "home",
        ("the move", "the new place", "the apartment", "boxes"),
        (
            Event(
                "We moved into a new apartment {neigh} {when}, boxes everywhere still.",
                "Where is {S}'s new apartment?",
                "When did {S} move?",
            ),
            Event(
                "I painted the new bedroom sage green {when}, it feels so calm now.",
                "What color did {S} paint the bedroom?",
                "When did {S} paint the bedroom?",
            ),
            Event(
                "We threw a housewarming party {when}, thirty people squeezed into our tiny place.",
                "How many people came to {S}'s housewarming?",
                "When was {S}'s housewarming party?",
            ),
        ),
        (
            "Moving is the worst, never again, haha.",
            "It finally feels like home here.",
            "I still can't find half my kitchen stuff.",
        ),
        "Did {S} recently change where they live?",
    ),
    Theme(
        "reading",
        "creative",
        ("reading", "the book", "the book club", "novels"),
        (
            Event(
                "I finished {book} {when}, I couldn't put it down.",
                "Which book did {S} finish?",
                "When did {S} finish the book?",
            ),
            Event(
                "I started a book club with neighbors {when}, six of us so far.",
                "What club did {S} start?",
                "When did {S} start the book club?",
            ),
            Event(
                "I wrote the first chapter of my own novel {when}, don't laugh!",
                "What is {S} writing?",
                "When did {S} write a first chapter?",
            ),
        ),
        (
            "Books are my favorite way to unwind.",
            "I always have a novel in my bag.",
            "Reading before bed is my ritual.",
        ),
        "Would {S} like a gift card to a bookstore?",
    ),
    Theme(
        "sports",
        "health",
        ("the team", "the game", "the league", "practice"),
        (
            Event(
                "I joined a rec {sport} league {when}, we lost our first game badly, haha.",
                "What sport league did {S} join?",
                "When did {S} join a league?",
            ),
            Event(
                "Our team won the {sport} championship {when}, I scored the last point!",
                "What did {S}'s team win?",
                "When did {S}'s team win the championship?",
            ),
            Event(
                "I got {injury} at practice {when}, so I'm on the bench for a while.",
                "What injury did {S} get?",
                "When did {S} get injured at practice?",
            ),
        ),
        (
            "Team sports are so good for my mood.",
            "I love the competition, honestly.",
            "My teammates have become close friends.",
        ),
        "Does {S} play a team sport?",
    ),
    Theme(
        "business",
        "career",
        ("the business", "your shop", "the launch", "customers"),
        (
            Event(
                "I'm finally opening {shop}, I signed the lease {when}!",
                "What business is {S} opening?",
                "When did {S} sign the lease?",
            ),
            Event(
                "We had our grand opening {when} and sold out by noon.",
                "How did the grand opening go for {S}?",
                "When was the grand opening?",
            ),
            Event(
                "A local newspaper wrote about my shop {when}, I'm framing it.",
                "Who wrote about {S}'s shop?",
                "When did the newspaper feature {S}'s shop?",
            ),
        ),
        (
            "Running your own thing is scary and amazing.",
            "Customers have been so kind, it keeps me going.",
            "I'm working seven days a week, but it's mine.",
        ),
        "Is {S} an entrepreneur?",
    ),
    Theme(
        "language",
        "career",
        ("the language", "your lessons", "practice", "the app"),
        (
            Event(
                "I started learning {lang} {when}, I practice on the train every day.",
                "What language is {S} learning?",
                "When did {S} start learning a language?",
            ),
            Event(
                "I had my first full conversation in {lang} with a waiter {when}!",
                "Who did {S} have a first conversation with in the new language?",
                "When did {S} manage a full conversation?",
            ),
            Event(
                "I passed the beginner certificate exam {when}, so proud.",
                "What certificate did {S} pass?",
                "When did {S} pass the certificate exam?",
            ),
        ),
        (
            "Languages are hard but so rewarding.",
            "I talk to myself in the shower to practice, haha.",
            "Grammar is the worst part, honestly.",
        ),
        "Would {S} enjoy living abroad?",
    ),
]
