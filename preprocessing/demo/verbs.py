"""Verb senses of the synthetic demo corpus: English and French conjugation and the frame each
sense is used in (transitive, ditransitive, intransitive; subject, object and recipient nouns).
"""

from __future__ import annotations

from dataclasses import dataclass

from preprocessing.demo.lexicon import ADVERBS, table_entries


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
_FR_IRREGULAR = dict(e.split("=") for e in table_entries("""
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


VERBS: list[Verb] = [_parse_verb(e) for e in table_entries(_VERBS)]
