"""Bilingual English/French lexicon, morphology and phrases of the synthetic `demo` corpus.

The word lists, inflection rules and phrase realizers (noun phrases, verb forms, French elision
and contraction) behind `preprocessing.demo`; see its docstring: the corpus is SYNTHETIC,
generated from a small grammar. Every entry pairs one English form with one French form, so an
English sentence has exactly one translation. Semantic tags on nouns keep the
generated sentences plausible ("the boy eats an apple", not "the table eats an idea"):

    major class (first letter): P person, A animal, F food, D drink, T thing, W work, L place
    sub-tags: c container/vehicle (in), s surface (on), n shelter (under), k big object (near),
      o openable, r readable, y writable, p portable, w wearable, v vehicle, d drivable,
      m instrument, u listenable, f fragile, z dish/drink one makes, x watchable,
      i place one is in, a place one is at, e enterable, b buildable

A noun *predicate* such as "PAv" matches nouns whose major class is P or A, or that carry tag v.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

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


def _entries(table: str) -> list[str]:
    """Table entries: separated by two spaces or a line break (one space may occur inside)."""
    return [e.strip() for line in table.strip().splitlines() for e in line.split("  ") if e.strip()]


def _parse_nouns() -> list[Noun]:
    nouns = []
    for entry in _entries(_NOUNS):
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
    for entry in _entries(_ADJECTIVES):
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


def en_3sg(base: str) -> str:
    if base.endswith(("s", "x", "z", "ch", "sh", "o")):
        return base + "es"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ies"
    return base + "s"


def _en_past(base: str) -> str:
    if base.endswith("e"):
        return base + "d"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ied"
    return base + "ed"


def _en_ing(base: str) -> str:
    if base.endswith("ie"):
        return base[:-2] + "ying"
    if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
        return base[:-1] + "ing"
    return base + "ing"


_PERSON_ENDINGS = {  # regular French present endings, je tu il nous vous ils
    "er": ("e", "es", "e", "ons", "ez", "ent"),
    "ir": ("is", "is", "it", "issons", "issez", "issent"),
    "re": ("s", "s", "", "ons", "ez", "ent"),
}
FUTURE_ENDINGS = ("ai", "as", "a", "ons", "ez", "ont")
IMPERFECT_ENDINGS = ("ais", "ais", "ait", "ions", "iez", "aient")


@dataclass(frozen=True)
class Verb:
    """One verb sense: English and French forms plus the frame it is used in."""

    en: str  # English base form
    en_3sg: str
    en_past: str
    en_pp: str  # English past participle (summaries: "has repaired")
    en_ing: str
    particle: str  # English particle after the verb: "listen to", "look for", "go out of"
    fr: str  # French infinitive
    present: tuple[str, ...]  # je tu il nous vous ils
    participle: str
    future_stem: str
    etre: bool  # passé composé with être (participle agrees with the subject)
    prep: str  # French preposition before the object: "", "à", "de", "dans"
    kind: str  # T transitive, I intransitive (needs a PP), D ditransitive ("give X to Y")
    subj: str  # noun predicate of the subject
    obj: str  # T/D: noun predicate of the object; I: PP kinds (L place, W with, F for)
    rec: str  # D: noun predicate of the recipient
    flags: str  # s stative (no progressive), n no simple past (read/read), D/P/G determiners
    adverbs: str  # I: manner adverb set (see ADVERBS)

    def imperfect(self, person: int) -> str:
        stem, end = self.present[3][:-3], IMPERFECT_ENDINGS[person]
        if end[0] == "i" and stem.endswith("ge"):  # mangeais but mangions
            stem = stem[:-1]
        elif end[0] == "i" and stem.endswith("ç"):  # lançais but lancions
            stem = stem[:-1] + "c"
        return stem + end

    def future(self, person: int) -> str:
        return self.future_stem + FUTURE_ENDINGS[person]

    def agreed_participle(self, fem: bool, plural: bool) -> str:
        return self.participle + ("e" if fem else "") + ("s" if plural else "")


# Irregular English forms: base -> "past participle[ -ing]"; the rest are regular.
_EN_IRREGULAR = dict(e.split(":") for e in """eat:ate_eaten drink:drank_drunk see:saw_seen
find:found_found lose:lost_lost buy:bought_bought sell:sold_sold read:read_read
write:wrote_written take:took_taken wear:wore_worn make:made_made draw:drew_drawn
build:built_built break:broke_broken leave:left_left meet:met_met feed:fed_fed
choose:chose_chosen hear:heard_heard send:sent_sent throw:threw_thrown catch:caught_caught
drive:drove_driven forget:forgot_forgotten_forgetting keep:kept_kept hide:hid_hidden
understand:understood_understood think:thought_thought go:went_gone come:came_come give:gave_given
show:showed_shown lend:lent_lent bring:brought_brought sleep:slept_slept run:ran_run_running
swim:swam_swum_swimming sing:sang_sung fall:fell_fallen prefer:preferred_preferred""".split())

# Irregular French verbs: infinitive -> "present (je tu il nous vous ils):participle:future stem";
# regular -er verbs need nothing, regular -ir (finir) and -re (vendre) verbs are marked.
_FR_IRREGULAR = dict(e.split("=") for e in _entries("""
boire=bois bois boit buvons buvez boivent:bu:boir
voir=vois vois voit voyons voyez voient:vu:verr
préférer=préfère préfères préfère préférons préférez préfèrent:préféré:préférer
acheter=achète achètes achète achetons achetez achètent:acheté:achèter
ouvrir=ouvre ouvres ouvre ouvrons ouvrez ouvrent:ouvert:ouvrir
offrir=offre offres offre offrons offrez offrent:offert:offrir
lire=lis lis lit lisons lisez lisent:lu:lir
écrire=écris écris écrit écrivons écrivez écrivent:écrit:écrir
prendre=prends prends prend prenons prenez prennent:pris:prendr
comprendre=comprends comprends comprend comprenons comprenez comprennent:compris:comprendr
faire=fais fais fait faisons faites font:fait:fer
nettoyer=nettoie nettoies nettoie nettoyons nettoyez nettoient:nettoyé:nettoier
envoyer=envoie envoies envoie envoyons envoyez envoient:envoyé:enverr
peindre=peins peins peint peignons peignez peignent:peint:peindr
construire=construis construis construit construisons construisez construisent:construit:construir
conduire=conduis conduis conduit conduisons conduisez conduisent:conduit:conduir
appeler=appelle appelles appelle appelons appelez appellent:appelé:appeller
suivre=suis suis suit suivons suivez suivent:suivi:suivr
recevoir=reçois reçois reçoit recevons recevez reçoivent:reçu:recevr
sourire=souris souris sourit sourions souriez sourient:souri:sourir
rire=ris ris rit rions riez rient:ri:rir
aller=vais vas va allons allez vont:allé:ir
venir=viens viens vient venons venez viennent:venu:viendr
sortir=sors sors sort sortons sortez sortent:sorti:sortir
partir=pars pars part partons partez partent:parti:partir
dormir=dors dors dort dormons dormez dorment:dormi:dormir
courir=cours cours court courons courez courent:couru:courr
finir=ir  choisir=ir  nourrir=ir  obéir=ir  perdre=re  vendre=re  attendre=re  entendre=re
répondre=re"""))


def _french_forms(inf: str) -> tuple[tuple[str, ...], str, str]:
    """(present, participle, future stem) of a French infinitive."""
    spec = _FR_IRREGULAR.get(inf, "er")
    if ":" in spec:
        present, participle, future_stem = spec.split(":")
        return tuple(present.split()), participle, future_stem
    stem = inf[:-2]
    present = [stem + e for e in _PERSON_ENDINGS[spec]]
    if spec == "er" and stem.endswith("g"):  # mangeons
        present[3] = stem + "eons"
    elif spec == "er" and stem.endswith("c"):  # lançons
        present[3] = stem[:-1] + "çons"
    participle = {"er": stem + "é", "ir": stem + "i", "re": stem + "u"}[spec]
    return tuple(present), participle, inf[:-1] if spec == "re" else inf


# English base (particle after "_") | French infinitive[+preposition] (* = passé composé with
# être) | kind | subject | object (or PP kinds) [>recipient] | flags
_VERBS = """
eat|manger|T|PA|F|-  drink|boire|T|PA|D|-  see|voir|T|PA|PATFL|s  watch|regarder|T|PA|PAxv|-
like|aimer|T|P|PATFDLW|sD  love|adorer|T|P|ATFDLW|sD  hate|détester|T|P|PATFDLW|sD
prefer|préférer|T|P|ATFDLW|sD  find|trouver|T|PA|PATFL|s  lose|perdre|T|P|p|s
buy|acheter|T|P|FDpd|-  sell|vendre|T|P|FDpdA|-  open|ouvrir|T|P|o|-  close|fermer|T|P|o|-
read|lire|T|P|r|n  write|écrire|T|P|y|-  take|prendre|T|P|pFDv|-  carry|porter|T|PA|p|-
wear|porter|T|P|w|-  prepare|préparer|T|P|z|-  make|faire|T|P|z|-  wash|laver|T|P|Apv|-
clean|nettoyer|T|P|eks|-  paint|peindre|T|P|bk|-  draw|dessiner|T|P|PATL|-
build|construire|T|P|b|-  break|casser|T|PA|f|-  repair|réparer|T|P|fv|-
look_for|chercher|T|PA|PATFL|-  visit|visiter|T|P|L|-  leave|quitter|T|P|L|-
help|aider|T|PA|PA|-  call|appeler|T|P|PA|-  meet|rencontrer|T|P|P|-  follow|suivre|T|PA|PAv|-
feed|nourrir|T|P|PA|-  choose|choisir|T|P|FDpW|-  finish|finir|T|P|FDWy|-
hear|entendre|T|PA|PAum|s  listen_to|écouter|T|PA|PAum|-  wait_for|attendre|T|PA|PAv|-
send|envoyer|T|P|p|-  receive|recevoir|T|P|p|s  throw|lancer|T|PA|p|-  catch|attraper|T|PA|Ap|-
drive|conduire|T|P|d|-  forget|oublier|T|P|pW|s  keep|garder|T|P|pA|-  hide|cacher|T|PA|p|-
understand|comprendre|T|P|PWr|s  play|jouer+de|T|P|m|G  talk_to|parler+à|T|P|PA|-
think_about|penser+à|T|P|PATFDLW|-  answer|répondre+à|T|P|P|-  obey|obéir+à|T|PA|P|-
phone|téléphoner+à|T|P|P|-  smile_at|sourire+à|T|P|PA|-  live_in|habiter+dans|T|PA|i|P
go_to|*aller+à|T|PA|a|P  come_from|*venir+de|T|PA|L|P  arrive_at|*arriver+à|T|P|a|P
return_to|*retourner+à|T|PA|a|P  enter|*entrer+dans|T|PA|e|P  stay_at|*rester+à|T|P|a|P
go_out_of|*sortir+de|T|PA|e|P
give|donner|D|P|FDp>PA|-  show|montrer|D|P|pA>P|-  offer|offrir|D|P|FDp>P|-
lend|prêter|D|P|p>P|-  bring|apporter|D|P|FDp>PA|-  sell|vendre|D|P|FDpdA>P|-
send|envoyer|D|P|p>P|-  read|lire|D|P|r>P|n  throw|lancer|D|PA|p>PA|-
sleep|dormir|I|PA|LW|R  run|courir|I|PA|LW|M  walk|marcher|I|PA|LW|M  swim|nager|I|PA|LW|M
dance|danser|I|P|LWF|M  sing|chanter|I|PA|LWF|S  work|travailler|I|P|LWF|C
laugh|rire|I|P|LW|S  cry|pleurer|I|P|L|N  play|jouer|I|PA|LW|M  wait|attendre|I|PA|LW|R
jump|sauter|I|PA|L|M  eat|manger|I|PA|LW|C  read|lire|I|P|LF|Cn  study|étudier|I|P|LW|C
cook|cuisiner|I|P|LWF|C  travel|voyager|I|P|LW|M  fall|*tomber|I|PA|L|F
leave|*partir|I|PA|W|M  arrive|*arriver|I|PA|LW|M  come|*venir|I|PA|W|M
go_out|*sortir|I|PA|W|M  write|écrire|I|P|LF|C  paint|peindre|I|P|LF|C
smile|sourire|I|P|L|H  stay|*rester|I|PA|LW|R
"""


def _parse_verb(entry: str) -> Verb:
    en, fr, kind, subj, obj, flags = entry.split("|")
    base, *particle = en.split("_")
    if base in _EN_IRREGULAR:
        past, pp, *ing = _EN_IRREGULAR[base].split("_")
    else:
        past, pp, ing = _en_past(base), _en_past(base), []
    etre = fr.startswith("*")
    inf, _, prep = fr.lstrip("*").partition("+")
    present, participle, future_stem = _french_forms(inf)
    obj, _, rec = obj.partition(">")
    adverbs = "".join(c for c in flags if c in ADVERBS) if kind == "I" else ""
    return Verb(base, en_3sg(base), past, pp, ing[0] if ing else _en_ing(base), " ".join(particle),
                inf, present, participle, future_stem, etre, prep, kind, subj, obj, rec,
                flags.strip("-"), adverbs)


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

VERBS: list[Verb] = [_parse_verb(e) for e in _entries(_VERBS)]

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


# ---------------------------------------------------------------------------------------------
# Phrases: determiners, noun phrases, subjects, verb forms and French orthography.


@dataclass(frozen=True)
class Det:
    key: str  # def, indef, dem, poss, num
    plural: bool
    en: str  # "" for the bare English plural ("apples" = "des pommes")
    fr: tuple[str, str, str]  # masculine singular, feminine singular, plural


def _det(key, plural, en, fr):
    return Det(key, plural, en, tuple(fr.split("/")))


THE, THE_PL = _det("def", False, "the", "le/la/les"), _det("def", True, "the", "le/la/les")
A, SOME = _det("indef", False, "a", "un/une/des"), _det("indef", True, "", "un/une/des")
THIS, THESE = _det("dem", False, "this", "ce/cette/ces"), _det("dem", True, "these", "ce/cette/ces")
MY, MY_PL = _det("poss", False, "my", "mon/ma/mes"), _det("poss", True, "my", "mon/ma/mes")
HIS, HER = _det("poss", False, "his", "son/sa/ses"), _det("poss", False, "her", "son/sa/ses")
THEIR, THEIR_PL = (_det("poss", False, "their", "leur/leur/leurs"),
                   _det("poss", True, "their", "leur/leur/leurs"))
TWO, THREE, FOUR, FIVE = (_det("num", True, e, f"{f}/{f}/{f}") for e, f in
                          (("two", "deux"), ("three", "trois"), ("four", "quatre"),
                           ("five", "cinq")))


def en_np(np, negative: bool = False) -> str:
    noun, det, adjs = np
    words = [a.en for a in sorted(adjs, key=lambda a: a.rank)]  # big red, happy old
    words.append(noun.en_pl if det.plural else noun.en)
    if negative:  # there is no cat
        article = "no"
    elif det.key == "indef" and not det.plural:
        article = "an" if en_vowel_initial(words[0]) else "a"
    else:
        article = det.en
    return f"{article} {' '.join(words)}" if article else " ".join(words)


def fr_np(np, negative: bool = False) -> list[str]:
    """French noun phrase; `negative`: indefinite article after ne ... pas becomes de."""
    noun, det, adjs = np
    fem, plural = noun.fem, det.plural
    head = noun.fr_pl if plural else noun.fr
    vowel = fr_vowel_initial(head)
    pre = [a.fr(fem, plural, vowel) for a in adjs if a.pre]  # un vieil arbre
    post = [a.fr(fem, plural) for a in adjs if not a.pre]
    first = pre[0] if pre else head
    if det.key == "indef" and (negative or (plural and pre)):  # pas de chat, de grands arbres
        article = "de"
    elif plural:
        article = det.fr[2]
    elif det.key == "dem" and not fem and fr_vowel_initial(first):
        article = "cet"
    elif det.key == "poss" and fem and fr_vowel_initial(first):  # mon école
        article = det.fr[0]
    else:
        article = det.fr[1] if fem else det.fr[0]
    return [article, *pre, head, *post]


class Subject(NamedTuple):
    en: str
    fr: str
    person: int  # 0..5 = je tu il nous vous ils
    fem: bool
    plural: bool
    who: str  # English agreement: 1s, 2, 3s, pl


# English "you" is French "tu" and "you all" is "vous", so each English sentence has one
# translation; "they" is "ils" (the French default for a group of unknown gender).
PRONOUNS = [Subject(en, fr, person, fem, person >= 3, who) for en, fr, person, fem, who in (
    ("I", "je", 0, False, "1s"), ("you", "tu", 1, False, "2"), ("he", "il", 2, False, "3s"),
    ("she", "elle", 2, True, "3s"), ("we", "nous", 3, False, "pl"),
    ("you all", "vous", 4, False, "pl"), ("they", "ils", 5, False, "pl"))]
THIRD_PERSON = PRONOUNS[2:4] + PRONOUNS[6:]  # gender known: être participles can agree
NAME_SUBJECTS = [Subject(e, f, 2, fem, False, "3s") for e, f, fem in NAMES]


def np_subject(np) -> Subject:
    noun, det, _ = np
    return Subject(en_np(np), " ".join(fr_np(np)), 5 if det.plural else 2, noun.fem, det.plural,
                   "pl" if det.plural else "3s")


AVOIR = ("ai", "as", "a", "avons", "avez", "ont")
ETRE = {"pres": ("suis", "es", "est", "sommes", "êtes", "sont"),
        "past": ("étais", "étais", "était", "étions", "étiez", "étaient"),  # imperfect
        "fut": ("serai", "seras", "sera", "serons", "serez", "seront")}


def en_verb(v: Verb, tense: str, neg: bool, who: str) -> str:
    third = who == "3s"
    if tense == "pres":
        words = f"{'does' if third else 'do'} not {v.en}" if neg else (v.en_3sg if third else v.en)
    elif tense == "past":
        words = f"did not {v.en}" if neg else v.en_past
    elif tense == "fut":
        words = f"will not {v.en}" if neg else f"will {v.en}"
    else:  # progressive past = French imperfect
        be = "was" if who in ("1s", "3s") else "were"
        words = f"{be} not {v.en_ing}" if neg else f"{be} {v.en_ing}"
    return f"{words} {v.particle}" if v.particle else words


def fr_verb(v: Verb, tense: str, neg: bool, s: Subject) -> str:
    p = s.person
    if tense == "past":  # passé composé
        aux, part = (ETRE["pres"] if v.etre else AVOIR)[p], v.participle
        if v.etre:
            part = v.agreed_participle(s.fem, s.plural)  # elle est partie, ils sont venus
        return f"ne {aux} pas {part}" if neg else f"{aux} {part}"
    form = {"pres": v.present[p], "fut": v.future(p)}.get(tense) or v.imperfect(p)
    return f"ne {form} pas" if neg else form


def en_be(tense: str, neg: bool, who: str) -> str:
    if tense == "fut":
        return "will not be" if neg else "will be"
    if tense == "pres":
        be = {"1s": "am", "3s": "is"}.get(who, "are")
    else:
        be = "was" if who in ("1s", "3s") else "were"
    return f"{be} not" if neg else be


# French orthography on the joined sentence: the article elides first (à l'école must not become
# "au école"), then à/de contract with le/les, then je/ne/de elide (j'ai, n'y, d'un).
_BEFORE_VOWEL = "(?=(?!(?:%s)\\b)[%s])" % ("|".join(NO_ELISION), VOWELS + VOWELS.upper())
_ARTICLE_ELISION = re.compile(r"(?<![\w'])(?:le|la) " + _BEFORE_VOWEL)
_CONTRACTION = re.compile(r"(?<![\w'])(à le|à les|de le|de les|de des|de de) ")
_CONTRACTED = {"à le": "au ", "à les": "aux ", "de le": "du ", "de les": "des ", "de des": "de ",
               "de de": "de "}
_ELISION = re.compile(r"(?<![\w'])(je|ne|de|que) " + _BEFORE_VOWEL)


def fr_sentence(parts: list[str]) -> str:
    """Join French words with elision and contraction, capitalize, add the full stop."""
    text = " ".join(p for p in parts if p)
    text = _ARTICLE_ELISION.sub("l'", text)
    text = _CONTRACTION.sub(lambda m: _CONTRACTED[m.group(1)], text)
    text = _ELISION.sub(lambda m: m.group(1)[:-1] + "'", text)
    return text[0].upper() + text[1:] + "."


def en_sentence(parts: list[str]) -> str:
    text = " ".join(p for p in parts if p) + "."
    return text[0].upper() + text[1:]


PREPS = {  # key: English, French, nouns it takes
    "in": ("in", "dans", "ic"), "on": ("on", "sur", "s"), "under": ("under", "sous", "n"),
    "near": ("near", "près de", "PALk"), "behind": ("behind", "derrière", "PALk"),
    "front": ("in front of", "devant", "PALk"), "next": ("next to", "à côté de", "PALk"),
    "at": ("at", "à", "a"), "with": ("with", "avec", "PA"), "for": ("for", "pour", "PA"),
}
LOCATIVE = ("in", "on", "under", "near", "behind", "front", "next", "at")
PP_KINDS = {"L": LOCATIVE, "W": ("with",), "F": ("for",)}


def en_pp(pp) -> str:
    return f"{PREPS[pp[0]][0]} {en_np(pp[1])}" if pp else ""


def fr_pp(pp) -> list[str]:
    return [PREPS[pp[0]][1], *fr_np(pp[1])] if pp else []
