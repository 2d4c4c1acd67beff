"""Bilingual English/French word lists of the synthetic demo corpus, with their inflections.

Nouns, adjectives, first names, manner adverbs and time adverbials (verbs are in
`preprocessing.demo.verbs`). The corpus is SYNTHETIC, generated from a small grammar (see
`preprocessing.demo`). Every entry pairs one English form with one French form, so an English
sentence has exactly one translation. Semantic tags on nouns keep the generated sentences
plausible ("the boy eats an apple", not "the table eats an idea"):

    major class (first letter): P person, A animal, F food, D drink, T thing, W work, L place
    sub-tags: c container/vehicle (in), s surface (on), n shelter (under), k big object (near),
      o openable, r readable, y writable, p portable, w wearable, v vehicle, d drivable,
      m instrument, u listenable, f fragile, z dish/drink one makes, x watchable,
      i place one is in, a place one is at, e enterable, b buildable

A noun *predicate* such as "PAv" matches nouns whose major class is P or A, or that carry tag v.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

# French words that start with a vowel sound take elided articles (l'homme, d'Anne); these
# start with a vowel letter or a mute h but do not elide (h aspiré, numerals).
NO_ELISION = ("hibou", "hiboux", "huit", "onze", "héros", "hamster")
VOWELS = "aeiouyàâäéèêëîïôöùûüœæh"


def fr_vowel_initial(word: str) -> bool:
    """True when a French word elides a preceding le/la/de/ne/je (vowel or mute h)."""
    w = word.lower()
    return bool(w) and w[0] in VOWELS and w.split()[0] not in NO_ELISION


def en_vowel_initial(word: str) -> bool:
    """True when an English word takes "an" rather than "a"."""
    w = word.lower()
    return w[0] in "aeiou" and not w.startswith(("use", "uni", "eu", "one"))


def en_plural(sg: str) -> str:
    if sg.endswith(("s", "x", "z", "ch", "sh")):
        return sg + "es"
    if sg.endswith("y") and sg[-2] not in "aeiou":
        return sg[:-1] + "ies"
    return sg + "s"


def fr_plural(sg: str) -> str:
    if sg.endswith(("s", "x", "z")):
        return sg
    if sg.endswith(("eau", "au", "eu")):
        return sg + "x"
    return sg + "s"


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    fr: str
    fr_pl: str
    fem: bool
    tags: str  # major class letter + sub-tags

    def matches(self, pred: str) -> bool:
        return self.tags[0] in pred or any(t in pred for t in self.tags[1:])


# en[/en plural] | fr[/fr plural] | gender | tags
_NOUNS = """
man/men|homme|m|P  woman/women|femme|f|P  boy|garçon|m|P  girl|fille|f|P
child/children|enfant|m|P  baby|bébé|m|P  teacher|professeur|m|P  doctor|médecin|m|P
student|étudiant|m|P  friend|ami|m|P  neighbor|voisin|m|P  king|roi|m|P  queen|reine|f|P
brother|frère|m|P  sister|sœur|f|P  father|père|m|P  mother|mère|f|P  uncle|oncle|m|P
aunt|tante|f|P  son|fils|m|P  baker|boulanger|m|P  farmer|fermier|m|P  nurse|infirmière|f|P
singer|chanteur|m|P  lawyer|avocat|m|P  soldier|soldat|m|P  cook|cuisinier|m|P
waiter|serveur|m|P  painter|peintre|m|P  writer|écrivain|m|P  pupil|élève|m|P
grandmother|grand-mère/grands-mères|f|P  grandfather|grand-père/grands-pères|m|P
policeman/policemen|policier|m|P  driver|chauffeur|m|P  guest|invité|m|P  lady|dame|f|P
prince|prince|m|P  princess|princesse|f|P  tourist|touriste|m|P  musician|musicien|m|P
engineer|ingénieur|m|P  pilot|pilote|m|P  journalist|journaliste|m|P  actor|acteur|m|P
actress|actrice|f|P  fisherman/fishermen|pêcheur|m|P  gardener|jardinier|m|P
dog|chien|m|A  cat|chat|m|A  horse|cheval/chevaux|m|A  bird|oiseau|m|A  cow|vache|f|A
mouse/mice|souris|f|A  rabbit|lapin|m|A  parrot|perroquet|m|A  lamb|agneau|m|A
duck|canard|m|A  goat|chèvre|f|A  pig|cochon|m|A  hen|poule|f|A  fox|renard|m|A
wolf/wolves|loup|m|A  bear|ours|m|A  lion|lion|m|A  tiger|tigre|m|A  elephant|éléphant|m|A
monkey|singe|m|A  frog|grenouille|f|A  bee|abeille|f|A  snake|serpent|m|A
owl|hibou/hiboux|m|A  donkey|âne|m|A  turtle|tortue|f|A  squirrel|écureuil|m|A
goose/geese|oie|f|A  spider|araignée|f|A  butterfly|papillon|m|A
apple|pomme|f|F  cake|gâteau|m|Fz  orange|orange|f|F  pear|poire|f|F  banana|banane|f|F
sandwich|sandwich|m|Fz  egg|œuf|m|F  tomato/tomatoes|tomate|f|F  carrot|carotte|f|F
cookie|biscuit|m|F  pie|tarte|f|Fz  lemon|citron|m|F  strawberry|fraise|f|F
potato/potatoes|pomme de terre/pommes de terre|f|F  onion|oignon|m|F  peach|pêche|f|F
cherry|cerise|f|F  pizza|pizza|f|Fz  croissant|croissant|m|F  cheese|fromage|m|F
sausage|saucisse|f|F  candy|bonbon|m|F  soup|soupe|f|Fz  salad|salade|f|Fz
coffee|café|m|Dz  tea|thé|m|Dz  beer|bière|f|D  lemonade|limonade|f|Dz  juice|jus|m|Dz
wine|vin|m|D  milkshake|milk-shake|m|Dz  soda|soda|m|D  cocktail|cocktail|m|Dz
book|livre|m|Troyp  letter|lettre|f|Troyp  newspaper|journal/journaux|m|Trp  key|clé|f|Tp
table|table|f|Tsnkb  chair|chaise|f|Tsnbf  door|porte|f|Tokb  window|fenêtre|f|Tokf
bag|sac|m|Tcop  box|boîte|f|Tcopb  ball|ballon|m|Tp  pen|stylo|m|Tp  pencil|crayon|m|Tp
painting|tableau|m|Tk  photo/photos|photo|f|Tp  phone|téléphone|m|Tpf
computer|ordinateur|m|Tf  car|voiture|f|Tcvdkf  bicycle|vélo|m|Tsvkf  bus|bus|m|Tcvdk
train|train|m|Tcvk  boat|bateau|m|Tsvkb  plane|avion|m|Tcvk  truck|camion|m|Tcvdnkf
hat|chapeau|m|Twp  coat|manteau|m|Twp  shoe|chaussure|f|Twp  shirt|chemise|f|Twp
dress|robe|f|Twp  scarf/scarves|écharpe|f|Twp  umbrella|parapluie|m|Tonpf  lamp|lampe|f|Tkf
bed|lit|m|Tsnk  clock|horloge|f|Tf  map|carte|f|Trp  ticket|billet|m|Tp  gift|cadeau|m|Top
flower|fleur|f|Tp  tree|arbre|m|Tnk  cup|tasse|f|Tcpf  glass|verre|m|Tcpf
plate|assiette|f|Tspf  knife/knives|couteau|m|Tp  spoon|cuillère|f|Tp
fork|fourchette|f|Tp  bottle|bouteille|f|Tcopf  basket|panier|m|Tcp  mirror|miroir|m|Tf
guitar|guitare|f|Tmpf  piano/pianos|piano|m|Tmkf  violin|violon|m|Tmpf  drum|tambour|m|Tmf
toy|jouet|m|Tpf  watch|montre|f|Twpf  wallet|portefeuille|m|Tp  candle|bougie|f|Tp
blanket|couverture|f|Tn  stone|pierre|f|Tp  rope|corde|f|Tp  ladder|échelle|f|Tk
bucket|seau|m|Tcp  suitcase|valise|f|Tcop  envelope|enveloppe|f|Top  notebook|cahier|m|Trp
desk|bureau|m|Tsnkb  shelf/shelves|étagère|f|Tsb  bench|banc|m|Tsnkb  sofa|canapé|m|Tsnk
radio/radios|radio|f|Tupf
song|chanson|f|Wuy  story/stories|histoire|f|Wry  poem|poème|m|Wry  movie|film|m|Wx
game|jeu/jeux|m|Wx
house|maison|f|Lieb  school|école|f|Liaeb  garden|jardin|m|Li  park|parc|m|Lia
city/cities|ville|f|Li  village|village|m|Lia  forest|forêt|f|Li  river|rivière|f|Li
lake|lac|m|Li  beach|plage|f|Las  mountain|montagne|f|Ls  church|église|f|Liaeb
hospital|hôpital/hôpitaux|m|Liaeb  hotel|hôtel|m|Liaeb  station|gare|f|Liaeb
market|marché|m|Lia  shop|magasin|m|Lieb  restaurant|restaurant|m|Liaeb
kitchen|cuisine|f|Lie  bedroom|chambre|f|Lie  street|rue|f|Li  bridge|pont|m|Lsnb
field|champ|m|Li  farm|ferme|f|Lab  castle|château|m|Liaeb
library/libraries|bibliothèque|f|Liaeb  museum|musée|m|Liaeb  office|bureau|m|Liae
bank|banque|f|Liaeb  island|île|f|Ls  airport|aéroport|m|Liab  theater|théâtre|m|Liaeb
factory/factories|usine|f|Liaeb  zoo/zoos|zoo|m|Lia  square|place|f|Ls  road|route|f|Ls
harbor|port|m|Lia  cinema|cinéma|m|Liaeb
"""


def table_entries(table: str) -> list[str]:
    """Table entries: separated by two spaces or a line break (one space may occur inside)."""
    return [e.strip() for line in table.strip().splitlines() for e in line.split("  ") if e.strip()]


def _parse_nouns() -> list[Noun]:
    nouns = []
    for entry in table_entries(_NOUNS):
        en, fr, g, tags = entry.split("|")
        en_sg, _, en_pl = en.partition("/")
        fr_sg, _, fr_pl = fr.partition("/")
        nouns.append(Noun(en_sg, en_pl or en_plural(en_sg), fr_sg, fr_pl or fr_plural(fr_sg),
                          g == "f", tags))
    return nouns


NOUNS: list[Noun] = _parse_nouns()


@dataclass(frozen=True)
class Adjective:
    en: str
    forms: tuple[str, str, str, str]  # French m sg, f sg, m pl, f pl
    vowel_form: str  # masculine singular before a vowel (vieil, bel, nouvel)
    pre: bool  # French position: before the noun (grand, petit, ...) or after it
    rank: int  # English order: opinion 1, size 2, quality 3, age 4, shape 5, colour 6
    pred: str  # nouns it describes (noun predicate)

    def fr(self, fem: bool, plural: bool, before_vowel: bool = False) -> str:
        if before_vowel and not fem and not plural:
            return self.vowel_form
        return self.forms[2 * plural + fem]

    @property
    def invariant(self) -> bool:
        """Same form for both genders: usable after je/tu/nous/vous, whose gender is unknown."""
        return self.forms[0] == self.forms[1] and self.forms[2] == self.forms[3]


# en | m/f[/m before vowel] | pre or post | English rank | noun predicate
_ADJECTIVES = """
big|grand/grande|pre|2|PATLF  small|petit/petite|pre|2|PATLF  young|jeune/jeune|pre|4|PA
old|vieux/vieille/vieil|pre|4|PATL  beautiful|beau/belle/bel|pre|1|PATLW
good|bon/bonne|pre|1|FDWT  new|nouveau/nouvelle/nouvel|pre|4|TLW  pretty|joli/jolie|pre|1|PATL
bad|mauvais/mauvaise|pre|1|FDW  long|long/longue|pre|2|TW
red|rouge/rouge|post|6|TAFL  blue|bleu/bleue|post|6|TAL  green|vert/verte|post|6|TAFL
black|noir/noire|post|6|TA  white|blanc/blanche|post|6|TALD  yellow|jaune/jaune|post|6|TAF
gray|gris/grise|post|6|TAL  brown|marron/marron|post|6|TA  pink|rose/rose|post|6|TF
happy|heureux/heureuse|post|3|PA  sad|triste/triste|post|3|PA  tired|fatigué/fatiguée|post|3|PA
angry|fâché/fâchée|post|3|PA  sick|malade/malade|post|3|PA  calm|calme/calme|post|3|PAL
proud|fier/fière|post|1|P  shy|timide/timide|post|1|PA  brave|courageux/courageuse|post|1|PA
lazy|paresseux/paresseuse|post|1|PA  curious|curieux/curieuse|post|1|PA
polite|poli/polie|post|1|P  kind|gentil/gentille|post|1|PA
clever|intelligent/intelligente|post|1|PA  funny|drôle/drôle|post|1|PW
rich|riche/riche|post|1|P  famous|célèbre/célèbre|post|1|PLW  strong|fort/forte|post|3|PAD
quiet|silencieux/silencieuse|post|3|PAL  noisy|bruyant/bruyante|post|3|PAL
hungry|affamé/affamée|post|3|PA  heavy|lourd/lourde|post|3|T  light|léger/légère|post|3|TF
hot|chaud/chaude|post|3|FD  cold|froid/froide|post|3|FDL  clean|propre/propre|post|3|TL
dirty|sale/sale|post|3|TLA  empty|vide/vide|post|3|cL  full|plein/pleine|post|3|c
broken|cassé/cassée|post|3|fv  open|ouvert/ouverte|post|3|o  closed|fermé/fermée|post|3|o
wet|mouillé/mouillée|post|3|TA  dry|sec/sèche|post|3|FDw  sweet|sucré/sucrée|post|3|FD
salty|salé/salée|post|3|F  delicious|délicieux/délicieuse|post|1|FD
fresh|frais/fraîche|post|3|FD  bitter|amer/amère|post|3|D  expensive|cher/chère|post|1|TFDL
modern|moderne/moderne|post|4|TL  strange|étrange/étrange|post|1|PATLW
dangerous|dangereux/dangereuse|post|1|ATL  useful|utile/utile|post|1|T
round|rond/ronde|post|5|T  fast|rapide/rapide|post|3|Av  slow|lent/lente|post|3|Av
dark|sombre/sombre|post|3|L  wide|large/large|post|2|L  narrow|étroit/étroite|post|2|L
interesting|intéressant/intéressante|post|1|Wr  boring|ennuyeux/ennuyeuse|post|1|PWr
huge|énorme/énorme|post|2|ATL  tiny|minuscule/minuscule|post|2|ATF  lost|perdu/perdue|post|3|Ap
"""


def _adj_plural(m: str) -> str:
    if m == "marron" or m.endswith(("s", "x")):  # colour nouns used as adjectives: invariable
        return m
    return m + "x" if m.endswith("eau") else m + "s"  # beaux, but bleus


def _parse_adjectives() -> list[Adjective]:
    adjs = []
    for entry in table_entries(_ADJECTIVES):
        en, forms, pos, rank, pred = entry.split("|")
        m, f, *vowel = forms.split("/")
        fp = f if m == "marron" else f + "s"
        adjs.append(Adjective(en, (m, f, _adj_plural(m), fp), vowel[0] if vowel else m,
                              pos == "pre", int(rank), pred))
    return adjs


ADJECTIVES: list[Adjective] = _parse_adjectives()

# (English, French, feminine) first names; the French side is the usual French equivalent.
NAMES: list[tuple[str, str, bool]] = [
    (e, f, g == "f") for e, f, g in (x.split("|") for x in """
Peter|Pierre|m John|Jean|m Mary|Marie|f James|Jacques|m Michael|Michel|m Stephen|Étienne|m
Anne|Anne|f Paul|Paul|m Louis|Louis|m Sophie|Sophie|f Julia|Julie|f Claire|Claire|f
Helen|Hélène|f Louise|Louise|f Thomas|Thomas|m Nicholas|Nicolas|m Luke|Luc|m
Matthew|Mathieu|m Andrew|André|m Emily|Émilie|f Charlotte|Charlotte|f Lucy|Lucie|f
Alice|Alice|f Margaret|Marguerite|f Joseph|Joseph|m Martin|Martin|m Anthony|Antoine|m
Francis|François|m Catherine|Catherine|f Caroline|Caroline|f""".split())]


# Manner adverbs of intransitive verbs, by set: English, French (after the verb or participle).
ADVERBS: dict[str, list[tuple[str, str]]] = {
    k: [tuple(a.split("/")) for a in v.split()] for k, v in {
        "M": "quickly/rapidement slowly/lentement calmly/calmement happily/joyeusement",
        "S": "loudly/bruyamment quietly/silencieusement happily/joyeusement",
        "N": "loudly/bruyamment quietly/silencieusement",
        "R": "calmly/calmement quietly/silencieusement peacefully/paisiblement",
        "C": "carefully/soigneusement quickly/rapidement slowly/lentement quietly/silencieusement",
        "F": "quickly/rapidement slowly/lentement",
        "H": "happily/joyeusement calmly/calmement",
    }.items()}

# Time adverbials by tense (English, French); the progressive past uses the "past" list and
# takes the French imperfect. They close the sentence in both languages.
TIMES: dict[str, list[tuple[str, str]]] = {
    k: [tuple(t.split("/")) for t in v.strip().split(",")] for k, v in {
        "pres": "today/aujourd'hui,now/maintenant,every day/tous les jours,every morning/tous "
                "les matins,every evening/tous les soirs,every week/toutes les semaines,on Sundays"
                "/le dimanche,on Mondays/le lundi,in the morning/le matin,in the evening/le soir",
        "past": "yesterday/hier,last night/hier soir,yesterday morning/hier matin,last week/la "
                "semaine dernière,last month/le mois dernier,last year/l'année dernière,this "
                "morning/ce matin,on Sunday/dimanche,two days ago/il y a deux jours,three weeks "
                "ago/il y a trois semaines",
        "fut": "tomorrow/demain,tomorrow morning/demain matin,tomorrow evening/demain soir,next "
               "week/la semaine prochaine,next month/le mois prochain,next year/l'année "
               "prochaine,on Sunday/dimanche,in two days/dans deux jours,in three weeks/dans "
               "trois semaines,tonight/ce soir",
    }.items()}
TIMES["prog"] = TIMES["past"]
