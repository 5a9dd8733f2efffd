"""A built-in synthetic clinical-notes corpus, generated deterministically from a seed.

The corpus imitates the kind of data a hospital would want to protect: discharge summaries
and progress notes that carry a patient's name, medical record number (MRN), phone number,
diagnoses and medications, with several notes per patient. Every person, number and date
is synthetic (names from ``faker``, numbers and dates from NumPy generators); nothing is
drawn from real records.

The protected unit can be a note or a patient: each row carries ``unit_id`` (the patient,
e.g. ``"patient-00012"``) and ``note_id`` (unique per row), so
``load_corpus(source="clinical", unit_column="note_id")`` gives note-level privacy and the
default gives patient-level privacy.

Variety is built in so that a model trained on the corpus learns language rather than one
template: about forty diagnoses with fitting symptoms, medications, doses, labs, hospital
courses and plans; several phrasings for every sentence; optional sections (vitals, labs,
allergies, social history, contact) whose presence and order are random; several heading,
date and layout styles.

Determinism: patient ``i`` depends only on ``(seed, i)``, so the same seed gives an
identical data set in any process, and a larger ``num_patients`` extends a smaller one
(the first patients are the same).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

import numpy as np

from dpaudit.errors import InputError

__all__ = [
    "DIAGNOSES",
    "COMORBIDITIES",
    "NOTE_TYPES",
    "Diagnosis",
    "generate_clinical_notes",
    "random_patient_fields",
    "format_mrn",
    "format_phone",
]

NOTE_TYPES = ("discharge_summary", "progress_note")

# A fixed, documented salt so that the corpus seed stream never coincides with another
# stream derived from the same run seed (canaries, splits) by accident.
_CORPUS_SALT = 0xC11A1C


# --------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    """One admitting diagnosis with what tends to be written about it."""

    name: str
    symptoms: tuple[str, ...]
    inpatient: tuple[str, ...]  # treatments given in hospital, with doses
    discharge_meds: tuple[str, ...]  # "drug dose route frequency"
    labs: tuple[tuple[str, float, float, str, int], ...]  # (name, low, high, unit, decimals)
    course: tuple[str, ...]  # hospital-course sentences (complete, no trailing period)
    plan: tuple[str, ...]  # plan items
    specialty: str
    febrile: bool = False
    exam: tuple[str, ...] = ()


DIAGNOSES: tuple[Diagnosis, ...] = (
    Diagnosis(
        "community-acquired pneumonia",
        ("productive cough", "fever", "pleuritic chest pain", "shortness of breath"),
        ("ceftriaxone 1 g IV daily", "azithromycin 500 mg IV daily"),
        ("amoxicillin-clavulanate 875 mg PO twice daily for 5 days", "azithromycin 250 mg PO daily for 3 days"),
        (("WBC", 12.5, 19.8, "K/uL", 1), ("procalcitonin", 0.6, 4.2, "ng/mL", 2)),
        ("chest x-ray showed a right lower lobe consolidation",
         "blood cultures remained negative and oxygen was weaned to room air",
         "fevers resolved within 48 hours of antibiotics"),
        ("complete the oral antibiotic course", "repeat chest x-ray in 6 weeks", "incentive spirometry"),
        "primary care", True, ("crackles at the right base", "decreased breath sounds on the right"),
    ),
    Diagnosis(
        "acute decompensated heart failure",
        ("worsening dyspnea on exertion", "orthopnea", "bilateral leg swelling", "weight gain of 4 kg"),
        ("furosemide 40 mg IV twice daily",),
        ("furosemide 40 mg PO daily", "metoprolol succinate 50 mg PO daily", "spironolactone 25 mg PO daily"),
        (("BNP", 650, 3400, "pg/mL", 0), ("creatinine", 1.0, 1.9, "mg/dL", 1)),
        ("diuresed a net 5 liters with IV furosemide",
         "echocardiogram showed an ejection fraction of 30 percent",
         "daily weights trended down and edema improved"),
        ("daily weights, call if gain over 1 kg in a day", "2 g sodium restriction", "titrate guideline-directed therapy"),
        "cardiology", False, ("jugular venous distension", "2+ pitting edema to the knees"),
    ),
    Diagnosis(
        "COPD exacerbation",
        ("increased sputum production", "wheezing", "worsening shortness of breath"),
        ("prednisone 40 mg PO daily", "ipratropium-albuterol nebulizers every 4 hours", "doxycycline 100 mg PO twice daily"),
        ("prednisone 40 mg PO daily for 2 more days", "tiotropium 18 mcg inhaled daily", "albuterol inhaler 2 puffs every 4 hours as needed"),
        (("pCO2", 46, 58, "mmHg", 0), ("WBC", 9.0, 14.2, "K/uL", 1)),
        ("treated with steroids, nebulizers and doxycycline",
         "required BiPAP for one night and then transitioned to nasal cannula",
         "ambulated on room air with saturations above 90 percent before discharge"),
        ("smoking cessation counseling", "pulmonary rehabilitation referral", "review inhaler technique"),
        "pulmonology", False, ("diffuse expiratory wheezes", "prolonged expiratory phase"),
    ),
    Diagnosis(
        "diabetic ketoacidosis",
        ("polyuria", "polydipsia", "nausea and vomiting", "abdominal pain"),
        ("insulin infusion per protocol", "normal saline boluses", "potassium repletion"),
        ("insulin glargine 20 units subcutaneously nightly", "insulin lispro sliding scale with meals"),
        (("glucose", 420, 780, "mg/dL", 0), ("anion gap", 20, 31, "mEq/L", 0), ("bicarbonate", 7, 14, "mEq/L", 0)),
        ("the anion gap closed within 18 hours on an insulin drip",
         "transitioned to subcutaneous insulin and tolerated a diet",
         "diabetes educator reviewed insulin administration"),
        ("check glucose four times daily", "endocrinology follow-up", "sick-day rules reviewed"),
        "endocrinology", False, ("dry mucous membranes", "Kussmaul respirations"),
    ),
    Diagnosis(
        "acute pyelonephritis",
        ("dysuria", "flank pain", "fever and chills", "urinary frequency"),
        ("ceftriaxone 1 g IV daily",),
        ("cephalexin 500 mg PO four times daily for 10 days",),
        (("WBC", 11.8, 18.5, "K/uL", 1), ("creatinine", 0.9, 1.6, "mg/dL", 1)),
        ("urine culture grew pan-sensitive E. coli",
         "renal ultrasound showed no hydronephrosis",
         "fevers resolved and oral antibiotics were tolerated"),
        ("complete antibiotics", "push oral fluids", "return for recurrent fever"),
        "primary care", True, ("right costovertebral angle tenderness",),
    ),
    Diagnosis(
        "cellulitis of the left lower extremity",
        ("redness and swelling of the left leg", "warmth of the left shin", "low-grade fevers"),
        ("cefazolin 2 g IV every 8 hours",),
        ("cephalexin 500 mg PO four times daily for 7 days",),
        (("WBC", 10.5, 16.0, "K/uL", 1), ("CRP", 40, 180, "mg/L", 0)),
        ("the area of erythema was marked and receded steadily",
         "ultrasound was negative for deep vein thrombosis",
         "leg elevation and IV cefazolin led to clear improvement"),
        ("keep the leg elevated", "monitor the marked border", "foot care and moisturizer for skin breaks"),
        "primary care", True, ("erythema with a well-demarcated border", "tenderness over the anterior shin"),
    ),
    Diagnosis(
        "atrial fibrillation with rapid ventricular response",
        ("palpitations", "lightheadedness", "fatigue"),
        ("diltiazem 10 mg IV push", "diltiazem infusion"),
        ("metoprolol tartrate 50 mg PO twice daily", "apixaban 5 mg PO twice daily"),
        (("TSH", 0.5, 3.8, "mIU/L", 2), ("troponin", 0.01, 0.04, "ng/mL", 2)),
        ("rate controlled with IV diltiazem and then oral metoprolol",
         "CHA2DS2-VASc score of 3 and anticoagulation was started",
         "telemetry showed heart rates in the 80s at discharge"),
        ("continue anticoagulation", "outpatient Holter monitor", "discuss rhythm control at follow-up"),
        "cardiology", False, ("irregularly irregular rhythm",),
    ),
    Diagnosis(
        "non-ST-elevation myocardial infarction",
        ("substernal chest pressure", "diaphoresis", "pain radiating to the left arm"),
        ("heparin infusion", "aspirin 325 mg PO once", "atorvastatin 80 mg PO nightly"),
        ("aspirin 81 mg PO daily", "ticagrelor 90 mg PO twice daily", "atorvastatin 80 mg PO nightly", "metoprolol succinate 25 mg PO daily"),
        (("troponin", 0.3, 4.8, "ng/mL", 2), ("LDL", 110, 190, "mg/dL", 0)),
        ("troponin peaked on hospital day 2",
         "cardiac catheterization showed a 90 percent LAD stenosis treated with a drug-eluting stent",
         "remained chest-pain free after the procedure"),
        ("dual antiplatelet therapy for 12 months", "cardiac rehabilitation referral", "no heavy lifting for one week"),
        "cardiology", False, ("no murmurs, rubs or gallops",),
    ),
    Diagnosis(
        "acute ischemic stroke",
        ("sudden right arm weakness", "slurred speech", "facial droop"),
        ("aspirin 325 mg PO once", "permissive hypertension for 24 hours"),
        ("aspirin 81 mg PO daily", "clopidogrel 75 mg PO daily for 21 days", "atorvastatin 80 mg PO nightly"),
        (("LDL", 120, 180, "mg/dL", 0), ("HbA1c", 5.8, 8.9, "%", 1)),
        ("MRI confirmed a small left MCA territory infarct",
         "was outside the window for thrombolysis",
         "speech and strength improved with physical and occupational therapy"),
        ("outpatient physical therapy", "blood pressure goal below 130/80", "neurology clinic in 6 weeks"),
        "neurology", False, ("mild right pronator drift", "NIH stroke scale of 3"),
    ),
    Diagnosis(
        "pulmonary embolism",
        ("acute shortness of breath", "pleuritic chest pain", "tachycardia"),
        ("heparin infusion",),
        ("apixaban 10 mg PO twice daily for 7 days, then 5 mg twice daily",),
        (("D-dimer", 1.8, 6.5, "ug/mL", 1), ("troponin", 0.01, 0.09, "ng/mL", 2)),
        ("CT angiogram showed bilateral segmental emboli",
         "echocardiogram showed no right heart strain",
         "transitioned from heparin to apixaban"),
        ("anticoagulation for at least 3 months", "avoid prolonged immobility", "age-appropriate cancer screening"),
        "hematology", False, ("tachycardic but well perfused",),
    ),
    Diagnosis(
        "acute kidney injury",
        ("decreased urine output", "fatigue", "poor oral intake"),
        ("isotonic fluids at 100 mL per hour",),
        ("hold lisinopril until follow-up labs",),
        (("creatinine", 2.1, 4.6, "mg/dL", 1), ("BUN", 38, 90, "mg/dL", 0), ("potassium", 4.9, 5.8, "mEq/L", 1)),
        ("creatinine peaked and then improved with hydration",
         "nephrotoxic medications were held",
         "renal ultrasound was unremarkable"),
        ("repeat basic metabolic panel in one week", "avoid NSAIDs", "resume ACE inhibitor if creatinine recovers"),
        "nephrology", False, ("dry mucous membranes",),
    ),
    Diagnosis(
        "sepsis from a urinary source",
        ("fever", "confusion", "rigors", "dysuria"),
        ("piperacillin-tazobactam 4.5 g IV every 6 hours", "30 mL/kg crystalloid bolus"),
        ("ciprofloxacin 500 mg PO twice daily for 7 days",),
        (("lactate", 2.4, 5.1, "mmol/L", 1), ("WBC", 15.0, 24.0, "K/uL", 1)),
        ("lactate cleared after fluid resuscitation",
         "antibiotics were narrowed once cultures returned",
         "mental status returned to baseline by hospital day 3"),
        ("complete antibiotics", "follow up urine culture results", "return precautions reviewed"),
        "infectious disease", True, ("warm extremities", "suprapubic tenderness"),
    ),
    Diagnosis(
        "upper gastrointestinal bleed",
        ("melena", "coffee-ground emesis", "lightheadedness"),
        ("pantoprazole 80 mg IV bolus then infusion", "2 units packed red blood cells"),
        ("pantoprazole 40 mg PO twice daily", "ferrous sulfate 325 mg PO daily"),
        (("hemoglobin", 6.4, 8.6, "g/dL", 1), ("BUN", 35, 70, "mg/dL", 0)),
        ("EGD showed a clean-based duodenal ulcer",
         "hemoglobin remained stable after transfusion",
         "H. pylori biopsy was sent"),
        ("avoid NSAIDs and alcohol", "repeat hemoglobin in one week", "treat H. pylori if positive"),
        "gastroenterology", False, ("epigastric tenderness",),
    ),
    Diagnosis(
        "acute pancreatitis",
        ("severe epigastric pain radiating to the back", "nausea", "vomiting"),
        ("lactated Ringer's at 150 mL per hour", "hydromorphone 0.5 mg IV every 3 hours as needed"),
        ("oxycodone 5 mg PO every 6 hours as needed for 3 days", "ondansetron 4 mg PO every 8 hours as needed"),
        (("lipase", 600, 4200, "U/L", 0), ("triglycerides", 120, 400, "mg/dL", 0)),
        ("right upper quadrant ultrasound showed gallstones",
         "diet was advanced as pain improved",
         "general surgery recommended cholecystectomy during this admission"),
        ("low-fat diet", "alcohol abstinence", "surgery follow-up"),
        "gastroenterology", False, ("epigastric tenderness without guarding",),
    ),
    Diagnosis(
        "hypertensive urgency",
        ("headache", "blurred vision", "blood pressure above 200 systolic at home"),
        ("labetalol 200 mg PO once", "amlodipine 10 mg PO daily"),
        ("amlodipine 10 mg PO daily", "chlorthalidone 25 mg PO daily"),
        (("creatinine", 0.8, 1.4, "mg/dL", 1), ("troponin", 0.0, 0.02, "ng/mL", 2)),
        ("blood pressure was lowered gradually with oral agents",
         "there was no evidence of end-organ damage",
         "home medication adherence was reviewed"),
        ("home blood pressure log", "low-sodium diet", "recheck blood pressure in one week"),
        "primary care", False, ("fundoscopic exam without papilledema",),
    ),
    Diagnosis(
        "asthma exacerbation",
        ("wheezing", "chest tightness", "nocturnal cough"),
        ("albuterol nebulizers every 2 hours", "methylprednisolone 60 mg IV every 12 hours", "magnesium sulfate 2 g IV once"),
        ("prednisone 40 mg PO daily for 5 days", "budesonide-formoterol 160/4.5 mcg 2 puffs twice daily", "albuterol inhaler as needed"),
        (("peak flow", 180, 290, "L/min", 0), ("eosinophils", 300, 900, "cells/uL", 0)),
        ("nebulizers were spaced to every 4 hours by day 2",
         "peak flow improved to 80 percent of predicted",
         "a viral trigger was suspected"),
        ("asthma action plan reviewed", "avoid known triggers", "spacer use taught"),
        "pulmonology", False, ("diffuse wheezing with good air movement",),
    ),
    Diagnosis(
        "small bowel obstruction",
        ("crampy abdominal pain", "bilious vomiting", "no bowel movement for 3 days"),
        ("nasogastric tube decompression", "bowel rest", "IV fluids"),
        ("docusate 100 mg PO twice daily",),
        (("lactate", 1.0, 2.2, "mmol/L", 1), ("potassium", 3.1, 3.6, "mEq/L", 1)),
        ("CT showed a partial obstruction with a transition point in the mid ileum",
         "the obstruction resolved with conservative management",
         "diet was advanced after return of bowel function"),
        ("soft diet for one week", "return for vomiting or distension", "surgery clinic follow-up"),
        "general surgery", False, ("distended abdomen with high-pitched bowel sounds",),
    ),
    Diagnosis(
        "acute cholecystitis",
        ("right upper quadrant pain", "fever", "nausea after fatty meals"),
        ("piperacillin-tazobactam 3.375 g IV every 6 hours",),
        ("acetaminophen 650 mg PO every 6 hours as needed", "oxycodone 5 mg PO every 6 hours as needed for 2 days"),
        (("WBC", 11.0, 17.5, "K/uL", 1), ("alkaline phosphatase", 110, 260, "U/L", 0)),
        ("ultrasound showed gallbladder wall thickening with a positive sonographic Murphy sign",
         "underwent uncomplicated laparoscopic cholecystectomy on hospital day 2",
         "tolerated a regular diet after surgery"),
        ("no lifting over 10 pounds for two weeks", "keep incisions clean and dry", "surgery clinic in 2 weeks"),
        "general surgery", True, ("right upper quadrant tenderness with a positive Murphy sign",),
    ),
    Diagnosis(
        "acute appendicitis",
        ("periumbilical pain migrating to the right lower quadrant", "anorexia", "low-grade fever"),
        ("cefoxitin 2 g IV every 6 hours",),
        ("ibuprofen 600 mg PO every 6 hours as needed", "acetaminophen 1 g PO every 8 hours as needed"),
        (("WBC", 12.0, 16.8, "K/uL", 1), ("CRP", 20, 110, "mg/L", 0)),
        ("CT confirmed a non-perforated appendicitis",
         "underwent laparoscopic appendectomy without complication",
         "pain was controlled with oral medications by the next morning"),
        ("no heavy lifting for two weeks", "return for fever or wound redness", "surgery follow-up"),
        "general surgery", True, ("right lower quadrant tenderness at McBurney point",),
    ),
    Diagnosis(
        "alcohol withdrawal",
        ("tremor", "anxiety", "sweating", "insomnia"),
        ("lorazepam per CIWA protocol", "thiamine 100 mg IV daily", "folic acid 1 mg PO daily"),
        ("thiamine 100 mg PO daily", "folic acid 1 mg PO daily", "naltrexone 50 mg PO daily"),
        (("AST", 60, 180, "U/L", 0), ("magnesium", 1.2, 1.7, "mg/dL", 1)),
        ("CIWA scores peaked on day 2 and then declined",
         "no seizures or delirium occurred",
         "social work met with the patient about outpatient treatment"),
        ("outpatient addiction medicine", "abstain from alcohol", "community support groups"),
        "addiction medicine", False, ("fine tremor of both hands",),
    ),
    Diagnosis(
        "symptomatic hyponatremia",
        ("confusion", "nausea", "unsteady gait"),
        ("fluid restriction to 1.2 liters per day", "hypertonic saline 100 mL bolus"),
        ("fluid restriction 1.5 liters per day", "sodium chloride tablets 1 g PO twice daily"),
        (("sodium", 116, 126, "mEq/L", 0), ("serum osmolality", 245, 268, "mOsm/kg", 0)),
        ("sodium was corrected by less than 8 mEq/L per day",
         "hydrochlorothiazide was identified as the likely cause and stopped",
         "mental status normalized"),
        ("recheck sodium in 3 days", "stop hydrochlorothiazide", "limit free water"),
        "nephrology", False, ("no focal neurologic deficits",),
    ),
    Diagnosis(
        "syncope",
        ("brief loss of consciousness", "lightheadedness on standing"),
        ("IV fluids", "telemetry monitoring"),
        ("compression stockings daily",),
        (("hemoglobin", 11.5, 14.5, "g/dL", 1), ("orthostatic drop", 20, 35, "mmHg", 0)),
        ("telemetry showed no arrhythmia over 48 hours",
         "orthostatic vital signs were positive and improved with fluids",
         "echocardiogram was normal"),
        ("rise slowly from sitting", "increase fluid intake", "event monitor if episodes recur"),
        "cardiology", False, ("orthostatic drop in blood pressure",),
    ),
    Diagnosis(
        "acute diverticulitis",
        ("left lower quadrant pain", "fever", "change in bowel habits"),
        ("ciprofloxacin 400 mg IV every 12 hours", "metronidazole 500 mg IV every 8 hours"),
        ("ciprofloxacin 500 mg PO twice daily for 7 days", "metronidazole 500 mg PO three times daily for 7 days"),
        (("WBC", 11.2, 15.9, "K/uL", 1), ("CRP", 45, 160, "mg/L", 0)),
        ("CT showed uncomplicated sigmoid diverticulitis",
         "pain improved with bowel rest and antibiotics",
         "diet was advanced to low residue"),
        ("colonoscopy in 6 to 8 weeks", "high-fiber diet after recovery", "return for worsening pain"),
        "gastroenterology", True, ("left lower quadrant tenderness",),
    ),
    Diagnosis(
        "right hip fracture",
        ("right hip pain after a fall", "inability to bear weight"),
        ("morphine 2 mg IV every 4 hours as needed", "enoxaparin 40 mg subcutaneously daily"),
        ("enoxaparin 40 mg subcutaneously daily for 28 days", "oxycodone 5 mg PO every 4 hours as needed", "calcium and vitamin D daily"),
        (("hemoglobin", 9.2, 11.4, "g/dL", 1), ("vitamin D", 12, 24, "ng/mL", 0)),
        ("underwent open reduction and internal fixation on hospital day 1",
         "physical therapy began the day after surgery",
         "discharged to a rehabilitation facility"),
        ("weight bearing as tolerated", "fall prevention", "DEXA scan for osteoporosis"),
        "orthopedics", False, ("shortened and externally rotated right leg",),
    ),
    Diagnosis(
        "COVID-19 pneumonia",
        ("fever", "dry cough", "loss of smell", "shortness of breath"),
        ("dexamethasone 6 mg IV daily", "remdesivir 100 mg IV daily", "enoxaparin 40 mg subcutaneously daily"),
        ("dexamethasone 6 mg PO daily to complete 10 days",),
        (("CRP", 60, 190, "mg/L", 0), ("D-dimer", 0.6, 2.4, "ug/mL", 1), ("ferritin", 400, 1500, "ng/mL", 0)),
        ("required up to 4 liters of oxygen by nasal cannula",
         "completed 5 days of remdesivir",
         "was weaned to room air before discharge"),
        ("home pulse oximetry", "isolate per current guidance", "return if saturation below 92 percent"),
        "infectious disease", True, ("bibasilar crackles",),
    ),
    Diagnosis(
        "Clostridioides difficile colitis",
        ("profuse watery diarrhea", "abdominal cramping", "fever"),
        ("oral vancomycin 125 mg four times daily", "IV fluids"),
        ("oral vancomycin 125 mg four times daily to complete 10 days",),
        (("WBC", 13.0, 22.0, "K/uL", 1), ("creatinine", 1.0, 1.8, "mg/dL", 1)),
        ("stool testing was positive for C. difficile toxin",
         "diarrhea decreased to two formed stools a day",
         "recent antibiotic exposure was noted"),
        ("contact precautions at home", "avoid unnecessary antibiotics", "return for recurrent diarrhea"),
        "infectious disease", True, ("mild diffuse abdominal tenderness",),
    ),
    Diagnosis(
        "hepatic encephalopathy due to cirrhosis",
        ("confusion", "day-night reversal", "asterixis noted by family"),
        ("lactulose 30 mL PO every 2 hours until bowel movement", "rifaximin 550 mg PO twice daily"),
        ("lactulose 20 g PO three times daily titrated to 3 soft stools", "rifaximin 550 mg PO twice daily"),
        (("ammonia", 90, 180, "umol/L", 0), ("bilirubin", 2.1, 5.8, "mg/dL", 1), ("INR", 1.4, 2.2, "", 1)),
        ("mental status cleared with lactulose",
         "no infection was found on paracentesis",
         "hepatology reviewed transplant evaluation"),
        ("titrate lactulose to 3 bowel movements daily", "abstain from alcohol", "hepatology clinic in 2 weeks"),
        "hepatology", False, ("asterixis", "scleral icterus"),
    ),
    Diagnosis(
        "new-onset seizure",
        ("witnessed generalized shaking", "post-ictal confusion", "tongue biting"),
        ("levetiracetam 1000 mg IV load",),
        ("levetiracetam 500 mg PO twice daily",),
        (("glucose", 85, 140, "mg/dL", 0), ("prolactin", 25, 60, "ng/mL", 0)),
        ("MRI of the brain was unremarkable",
         "EEG showed no epileptiform discharges",
         "no further seizures occurred on levetiracetam"),
        ("no driving per state law", "seizure precautions", "neurology follow-up"),
        "neurology", False, ("non-focal neurologic exam",),
    ),
    Diagnosis(
        "iron deficiency anemia",
        ("fatigue", "exertional dyspnea", "pica"),
        ("ferric carboxymaltose 750 mg IV", "1 unit packed red blood cells"),
        ("ferrous sulfate 325 mg PO every other day",),
        (("hemoglobin", 6.8, 8.9, "g/dL", 1), ("ferritin", 3, 12, "ng/mL", 0), ("MCV", 64, 76, "fL", 0)),
        ("transfused one unit with appropriate rise",
         "colonoscopy and EGD were arranged as an outpatient",
         "received IV iron before discharge"),
        ("recheck hemoglobin in 2 weeks", "outpatient endoscopy", "take iron with vitamin C"),
        "hematology", False, ("conjunctival pallor",),
    ),
    Diagnosis(
        "influenza A",
        ("fever", "myalgias", "cough", "sore throat"),
        ("oseltamivir 75 mg PO twice daily",),
        ("oseltamivir 75 mg PO twice daily to complete 5 days",),
        (("WBC", 3.2, 7.0, "K/uL", 1), ("CRP", 15, 70, "mg/L", 0)),
        ("rapid influenza PCR was positive",
         "treated with oseltamivir and supportive care",
         "remained on room air"),
        ("annual influenza vaccination", "rest and fluids", "return for shortness of breath"),
        "primary care", True, ("clear lungs",),
    ),
    Diagnosis(
        "chest pain, acute coronary syndrome ruled out",
        ("intermittent chest pain", "pain worse with exertion"),
        ("aspirin 325 mg PO once", "nitroglycerin 0.4 mg SL as needed"),
        ("aspirin 81 mg PO daily", "nitroglycerin 0.4 mg SL as needed for chest pain"),
        (("troponin", 0.0, 0.02, "ng/mL", 2), ("LDL", 90, 160, "mg/dL", 0)),
        ("serial troponins were negative",
         "exercise stress test showed no inducible ischemia",
         "pain was felt to be musculoskeletal"),
        ("cardiology follow-up", "lipid management", "return for chest pain at rest"),
        "cardiology", False, ("reproducible chest wall tenderness",),
    ),
    Diagnosis(
        "acute gout flare",
        ("acute pain and swelling of the right first toe", "inability to wear a shoe"),
        ("prednisone 40 mg PO daily", "colchicine 0.6 mg PO twice daily"),
        ("prednisone taper over 10 days", "colchicine 0.6 mg PO daily"),
        (("uric acid", 7.8, 11.5, "mg/dL", 1), ("creatinine", 0.9, 1.5, "mg/dL", 1)),
        ("joint aspiration showed negatively birefringent crystals",
         "pain improved markedly with steroids",
         "allopurinol will be started after the flare resolves"),
        ("limit alcohol and red meat", "start allopurinol in 2 weeks", "rheumatology referral"),
        "rheumatology", False, ("warm, swollen first metatarsophalangeal joint",),
    ),
    Diagnosis(
        "major depressive episode with suicidal ideation",
        ("low mood", "poor sleep", "passive suicidal thoughts"),
        ("sertraline 50 mg PO daily", "one-to-one observation"),
        ("sertraline 100 mg PO daily", "hydroxyzine 25 mg PO every 6 hours as needed for anxiety"),
        (("TSH", 0.8, 3.2, "mIU/L", 2), ("vitamin B12", 250, 700, "pg/mL", 0)),
        ("psychiatry followed daily and sertraline was titrated",
         "safety plan was completed with the patient",
         "mood and sleep improved"),
        ("outpatient psychiatry within one week", "crisis line numbers provided", "firearm safety discussed"),
        "psychiatry", False, ("flat affect, linear thought process",),
    ),
    Diagnosis(
        "hyperkalemia",
        ("generalized weakness", "palpitations"),
        ("calcium gluconate 1 g IV", "insulin 10 units IV with dextrose", "sodium zirconium cyclosilicate 10 g PO"),
        ("sodium zirconium cyclosilicate 10 g PO daily", "low-potassium diet"),
        (("potassium", 6.2, 7.4, "mEq/L", 1), ("creatinine", 1.8, 3.2, "mg/dL", 1)),
        ("ECG showed peaked T waves that resolved with treatment",
         "spironolactone was identified as the likely cause and held",
         "potassium normalized by the next morning"),
        ("repeat potassium in 3 days", "low-potassium diet handout", "hold spironolactone"),
        "nephrology", False, ("no focal weakness",),
    ),
    Diagnosis(
        "lower extremity deep vein thrombosis",
        ("left calf pain", "left leg swelling"),
        ("enoxaparin 1 mg/kg subcutaneously every 12 hours",),
        ("rivaroxaban 15 mg PO twice daily for 21 days, then 20 mg daily",),
        (("D-dimer", 1.2, 4.8, "ug/mL", 1), ("platelets", 180, 340, "K/uL", 0)),
        ("duplex ultrasound showed an occlusive popliteal vein thrombus",
         "started on anticoagulation without bleeding",
         "swelling improved with elevation"),
        ("anticoagulation for 3 months", "compression stockings", "hematology follow-up"),
        "hematology", False, ("left calf 3 cm larger than right",),
    ),
    Diagnosis(
        "hyperosmolar hyperglycemic state",
        ("polyuria", "lethargy", "blurred vision"),
        ("insulin infusion", "aggressive IV fluids"),
        ("insulin glargine 18 units subcutaneously nightly", "metformin 500 mg PO twice daily"),
        (("glucose", 650, 1100, "mg/dL", 0), ("serum osmolality", 320, 360, "mOsm/kg", 0)),
        ("glucose and osmolality corrected over 36 hours",
         "transitioned to basal insulin",
         "received diabetes education"),
        ("glucose log", "endocrinology referral", "HbA1c in 3 months"),
        "endocrinology", False, ("dry mucous membranes, lethargic but arousable",),
    ),
    Diagnosis(
        "migraine with status migrainosus",
        ("severe unilateral headache for 4 days", "photophobia", "nausea"),
        ("prochlorperazine 10 mg IV", "diphenhydramine 25 mg IV", "ketorolac 15 mg IV", "magnesium 2 g IV"),
        ("sumatriptan 50 mg PO as needed", "topiramate 25 mg PO nightly"),
        (("ESR", 4, 18, "mm/hr", 0), ("CRP", 1, 6, "mg/L", 0)),
        ("headache broke after the migraine cocktail",
         "CT head was negative",
         "medication-overuse headache was discussed"),
        ("headache diary", "limit analgesics to 2 days per week", "neurology follow-up"),
        "neurology", False, ("normal neurologic exam",),
    ),
    Diagnosis(
        "acute urinary retention",
        ("inability to void", "suprapubic pain"),
        ("Foley catheter placement", "tamsulosin 0.4 mg PO nightly"),
        ("tamsulosin 0.4 mg PO nightly",),
        (("creatinine", 1.1, 2.0, "mg/dL", 1), ("PSA", 2.5, 9.0, "ng/mL", 1)),
        ("bladder scan showed more than 900 mL",
         "passed a voiding trial on hospital day 2",
         "anticholinergic medications were stopped"),
        ("urology follow-up", "avoid decongestants", "return if unable to void"),
        "urology", False, ("distended bladder",),
    ),
)

# Chronic conditions with home medications; a patient has zero to three of them.
COMORBIDITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hypertension", ("lisinopril 20 mg PO daily", "amlodipine 5 mg PO daily", "losartan 50 mg PO daily")),
    ("hyperlipidemia", ("atorvastatin 40 mg PO nightly", "rosuvastatin 10 mg PO daily")),
    ("type 2 diabetes mellitus", ("metformin 1000 mg PO twice daily", "empagliflozin 10 mg PO daily")),
    ("hypothyroidism", ("levothyroxine 75 mcg PO daily", "levothyroxine 100 mcg PO daily")),
    ("gastroesophageal reflux disease", ("omeprazole 20 mg PO daily", "famotidine 20 mg PO twice daily")),
    ("chronic kidney disease stage 3", ("sodium bicarbonate 650 mg PO twice daily",)),
    ("coronary artery disease", ("aspirin 81 mg PO daily", "metoprolol succinate 25 mg PO daily")),
    ("osteoarthritis", ("acetaminophen 650 mg PO every 6 hours as needed",)),
    ("depression", ("sertraline 50 mg PO daily", "escitalopram 10 mg PO daily")),
    ("generalized anxiety disorder", ("buspirone 10 mg PO twice daily",)),
    ("benign prostatic hyperplasia", ("tamsulosin 0.4 mg PO nightly",)),
    ("obstructive sleep apnea", ("CPAP nightly",)),
    ("asthma", ("albuterol inhaler as needed", "fluticasone 110 mcg 2 puffs twice daily")),
    ("atrial fibrillation", ("apixaban 5 mg PO twice daily", "diltiazem ER 180 mg PO daily")),
    ("obesity", ()),
    ("chronic low back pain", ("gabapentin 300 mg PO three times daily",)),
)

_ALLERGIES = ("penicillin (rash)", "sulfa drugs (hives)", "codeine (nausea)", "latex", "iodinated contrast (itching)",
              "shellfish", "lisinopril (angioedema)", "morphine (pruritus)")
_SOCIAL = (
    "Lives with {rel} in {city}.", "Lives alone in {city} and is independent in daily activities.",
    "Retired {job}; lives in {city}.", "Works as a {job} in {city}.", "Lives in {city} with {rel}; never smoker.",
    "Former smoker, quit {n} years ago; lives in {city}.", "Drinks alcohol socially; lives with {rel}.",
)
_RELATIONS = ("her husband", "his wife", "a daughter", "a son", "a partner", "two roommates", "family")
_JOBS = ("teacher", "electrician", "nurse", "accountant", "truck driver", "cook", "engineer", "cashier",
         "carpenter", "librarian", "mechanic", "farmer", "office manager", "bus driver")
_DISPOSITIONS = ("home", "home with visiting nurse services", "home with family", "a skilled nursing facility",
                 "an acute rehabilitation facility", "home with physical therapy")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _subset(rng: np.random.Generator, seq, lo: int, hi: int) -> list:
    """A random subset of ``seq`` of size in [lo, hi] (clipped), keeping the original order."""
    hi = min(hi, len(seq))
    lo = min(lo, hi)
    k = int(rng.integers(lo, hi + 1))
    idx = np.sort(rng.choice(len(seq), size=k, replace=False))
    return [seq[i] for i in idx]


def _join(items: list[str]) -> str:
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def format_mrn(value: int) -> str:
    """MRNs in this corpus are 8 digits (leading zeros kept)."""
    return f"{value:08d}"


def format_phone(area: int, exchange: int, line: int) -> str:
    return f"({area:03d}) {exchange:03d}-{line:04d}"


def _random_phone(rng: np.random.Generator) -> str:
    return format_phone(int(rng.integers(201, 990)), int(rng.integers(200, 1000)), int(rng.integers(0, 10000)))


def _fmt_date(d: _dt.date, style: int) -> str:
    if style == 0:
        return d.isoformat()
    if style == 1:
        return f"{d.month:02d}/{d.day:02d}/{d.year}"
    return f"{_MONTHS[d.month - 1]} {d.day}, {d.year}"


def _lab_value(rng: np.random.Generator, lab: tuple[str, float, float, str, int]) -> str:
    name, lo, hi, unit, dec = lab
    v = float(rng.uniform(lo, hi))
    num = f"{v:.{dec}f}" if dec else f"{int(round(v))}"
    return f"{name} {num} {unit}".rstrip()


_BASE_DATE = _dt.date(2014, 1, 1)


@dataclass
class _Patient:
    pid: str
    first: str
    last: str
    sex: str  # "F" | "M"
    age: int
    dob: _dt.date
    mrn: str
    phone: str
    dx: Diagnosis
    comorbid: list[tuple[str, tuple[str, ...]]]
    home_meds: list[str]
    allergies: list[str]
    attending: str
    pcp: str
    city: str
    social: str
    admit: _dt.date

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


def _make_patient(pid: str, rng: np.random.Generator, fake) -> _Patient:
    sex = "F" if rng.random() < 0.5 else "M"
    first = fake.first_name_female() if sex == "F" else fake.first_name_male()
    last = fake.last_name()
    attending = fake.last_name()
    pcp = fake.last_name()
    city = fake.city()
    age = int(np.clip(rng.normal(62, 17), 18, 97))
    admit = _BASE_DATE + _dt.timedelta(days=int(rng.integers(0, 3650)))
    dob = _dt.date(admit.year - age, int(rng.integers(1, 13)), int(rng.integers(1, 29)))
    mrn = format_mrn(int(rng.integers(0, 10**8)))
    phone = _random_phone(rng)
    dx = _pick(rng, DIAGNOSES)
    comorbid = _subset(rng, COMORBIDITIES, 0, 3)
    home_meds = [_pick(rng, meds) for _, meds in comorbid if meds]
    allergies = _subset(rng, _ALLERGIES, 0, 2) if rng.random() < 0.45 else []
    rel = _pick(rng, _RELATIONS)
    if sex == "F" and rel == "his wife":
        rel = "her husband"
    if sex == "M" and rel == "her husband":
        rel = "his wife"
    social = _pick(rng, _SOCIAL).format(rel=rel, city=city, job=_pick(rng, _JOBS), n=int(rng.integers(2, 30)))
    return _Patient(pid, first, last, sex, age, dob, mrn, phone, dx, comorbid, home_meds, allergies,
                    attending, pcp, city, social, admit)


# --------------------------------------------------------------------------------------
# Sentence generators: several phrasings per slot
# --------------------------------------------------------------------------------------


def _sexword(p: _Patient, rng) -> str:
    return _pick(rng, ("woman", "female")) if p.sex == "F" else _pick(rng, ("man", "male"))


def _pron(p: _Patient) -> tuple[str, str]:
    return ("she", "her") if p.sex == "F" else ("he", "his")


def _history_phrase(p: _Patient) -> str:
    names = [c for c, _ in p.comorbid]
    return _join(names) if names else ""


def _hpi(p: _Patient, rng) -> str:
    syms = _subset(rng, p.dx.symptoms, 2, 3)
    dur = _pick(rng, ("2 days", "3 days", "one week", "several days", "24 hours", "5 days", "two weeks"))
    hist = _history_phrase(p)
    he, his = _pron(p)
    sw = _sexword(p, rng)
    hist_a = f" with a history of {hist}" if hist else " with no significant past medical history"
    hist_b = f"PMH: {hist}. " if hist else "No significant past medical history. "
    choices = (
        f"{p.age}-year-old {sw}{hist_a} who presented with {_join(syms)} for {dur}.",
        f"{p.first} {p.last} is a {p.age}-year-old {sw}{hist_a}. {he.capitalize()} came to the emergency department "
        f"after {dur} of {_join(syms)}.",
        f"{hist_b}{he.capitalize()} reports {_join(syms)} over the past {dur}.",
        f"This {p.age} y/o {sw} presented with {syms[0]}, which began {dur} ago, along with {_join(syms[1:])}.",
        f"Patient is a {p.age}yo {p.sex}{hist_a}, admitted for {_join(syms)} of {dur} duration.",
    )
    return _pick(rng, choices)


def _course(p: _Patient, rng) -> str:
    sents = _subset(rng, p.dx.course, 2, 3)
    tx = _subset(rng, p.dx.inpatient, 1, 2)
    he, _ = _pron(p)
    starts = (
        f"{he.capitalize()} was admitted to medicine and started on {_join(tx)}.",
        f"Treated with {_join(tx)}.",
        f"On admission {he} received {_join(tx)}.",
        f"Management included {_join(tx)}.",
    )
    connectors = ("", "", "", "Subsequently, ", "During the stay, ", "Of note, ", "Thereafter ", "Later, ")
    order = rng.permutation(len(connectors))
    body = [_pick(rng, starts)]
    for s, ci in zip(sents, order):
        c = connectors[ci]
        body.append((c + s) if c else (s[0].upper() + s[1:]))
    return " ".join(x if x.endswith(".") else x + "." for x in body)


def _vitals(p: _Patient, rng) -> str:
    t = rng.uniform(37.9, 39.2) if (p.dx.febrile and rng.random() < 0.6) else rng.uniform(36.2, 37.4)
    hr = int(rng.integers(58, 118))
    sbp = int(rng.integers(98, 172))
    dbp = int(rng.integers(56, 98))
    rr = int(rng.integers(12, 24))
    spo2 = int(rng.integers(89, 100))
    style = int(rng.integers(3))
    if style == 0:
        return f"T {t:.1f} C, HR {hr}, BP {sbp}/{dbp}, RR {rr}, SpO2 {spo2}% on room air."
    if style == 1:
        return f"Temp {t:.1f}, pulse {hr}, blood pressure {sbp}/{dbp}, respirations {rr}, O2 sat {spo2}%."
    return f"Vitals: {t:.1f} / {hr} / {sbp}/{dbp} / {rr} / {spo2}%."


def _labs(p: _Patient, rng) -> str:
    vals = [_lab_value(rng, lab) for lab in _subset(rng, p.dx.labs, 1, 3)]
    if rng.random() < 0.5:
        vals.append(_lab_value(rng, _pick(rng, (("sodium", 134, 144, "mEq/L", 0), ("potassium", 3.5, 4.9, "mEq/L", 1),
                                               ("hemoglobin", 11.0, 15.5, "g/dL", 1), ("platelets", 150, 400, "K/uL", 0)))))
    lead = _pick(rng, ("Notable labs: ", "Labs significant for ", "Labs: ", "Pertinent results include "))
    return lead + "; ".join(vals) + "."


def _meds_section(p: _Patient, rng, heading: str) -> str:
    meds = list(_subset(rng, p.dx.discharge_meds, 1, 3)) + list(_subset(rng, p.home_meds, 0, 3))
    if rng.random() < 0.5:
        return f"{heading}\n" + "\n".join(f"{i + 1}. {m}" for i, m in enumerate(meds))
    if rng.random() < 0.5:
        return f"{heading}\n" + "\n".join(f"- {m}" for m in meds)
    return f"{heading} " + "; ".join(meds) + "."


def _allergy_line(p: _Patient, rng) -> str:
    if not p.allergies:
        return _pick(rng, ("Allergies: NKDA.", "No known drug allergies.", "Allergies: none known."))
    return _pick(rng, ("Allergies: ", "ALLERGIES: ", "Allergic to ")) + _join(p.allergies) + "."


def _contact_line(p: _Patient, rng) -> str:
    he, his = _pron(p)
    return _pick(rng, (
        f"Contact phone: {p.phone}.",
        f"Patient can be reached at {p.phone}.",
        f"Best callback number {p.phone}.",
        f"{his.capitalize()} phone number on file is {p.phone}.",
        f"Phone: {p.phone}",
    ))


def _diagnosis_line(p: _Patient, rng) -> str:
    sec = [c for c, _ in p.comorbid]
    if rng.random() < 0.5:
        s = f"Principal diagnosis: {p.dx.name}."
        if sec:
            s += f" Secondary diagnoses: {_join(sec)}."
        return s
    return _pick(rng, ("Diagnosis: ", "Discharge diagnosis: ", "Primary diagnosis: ")) + p.dx.name + (
        f" (also {', '.join(sec)})." if sec else ".")


def _disposition(p: _Patient, rng, date: str) -> str:
    dispo = _pick(rng, _DISPOSITIONS)
    n_weeks = int(rng.integers(1, 5))
    weeks = "1 week" if n_weeks == 1 else f"{n_weeks} weeks"
    plan = _subset(rng, p.dx.plan, 1, 2)
    he, his = _pron(p)
    return _pick(rng, (
        f"Discharged to {dispo} on {date} in stable condition. Follow up with {p.dx.specialty} in {weeks} "
        f"and with Dr. {p.pcp}. Instructions: {_join(plan)}.",
        f"Disposition: {dispo}. Follow-up: {p.dx.specialty} clinic in {weeks}; PCP Dr. {p.pcp}. "
        f"{_join(plan).capitalize()}.",
        f"{he.capitalize()} is stable for discharge to {dispo}. Plan: {_join(plan)}. "
        f"Appointment with Dr. {p.pcp} in {weeks}.",
    ))


# --------------------------------------------------------------------------------------
# Notes
# --------------------------------------------------------------------------------------


def _discharge_summary(p: _Patient, rng, admit: _dt.date, discharge: _dt.date) -> str:
    ds = int(rng.integers(3))
    a, d, dob = _fmt_date(admit, ds), _fmt_date(discharge, ds), _fmt_date(p.dob, ds)
    header = _pick(rng, (
        f"DISCHARGE SUMMARY\nPatient: {p.name}  MRN: {p.mrn}  DOB: {dob}\nAdmitted: {a}  Discharged: {d}  "
        f"Attending: Dr. {p.attending}",
        f"Discharge Summary for {p.name} (MRN {p.mrn}). Admission date {a}; discharge date {d}.",
        f"{p.name}, MRN {p.mrn}, DOB {dob}. Discharge summary by Dr. {p.attending}, {d}.",
        f"Name: {p.last}, {p.first}\nMRN: {p.mrn}\nAdmission: {a}\nDischarge: {d}\nDischarge Summary",
    ))
    h = int(rng.integers(3))
    heads = (("HPI:", "Hospital Course:", "Discharge Medications:"),
             ("HISTORY OF PRESENT ILLNESS:", "HOSPITAL COURSE:", "DISCHARGE MEDICATIONS:"),
             ("History:", "Course:", "Medications at discharge:"))[h]
    core = [_diagnosis_line(p, rng), f"{heads[0]} {_hpi(p, rng)}", f"{heads[1]} {_course(p, rng)}"]
    if rng.random() < 0.3:  # diagnosis after the narrative sometimes
        core = core[1:] + core[:1]
    optional = []
    if rng.random() < 0.35:
        optional.append(_pick(rng, ("Vitals on admission: ", "Admission vitals: ", "")) + _vitals(p, rng))
    if rng.random() < 0.45:
        optional.append(_labs(p, rng))
    if rng.random() < 0.4:
        optional.append(_allergy_line(p, rng))
    if rng.random() < 0.25:
        optional.append(_pick(rng, ("Social history: ", "SH: ", "Social: ")) + p.social)
    rng.shuffle(optional)
    # Optional sections go after the first narrative block, in random order.
    body = core[:2] + optional + core[2:]
    tail = [_meds_section(p, rng, heads[2]), _disposition(p, rng, d)]
    if rng.random() < 0.7:
        tail.insert(int(rng.integers(0, 3)), _contact_line(p, rng))
    return "\n".join([header] + body + tail)


def _progress_note(p: _Patient, rng, date: _dt.date, day: int) -> str:
    ds = int(rng.integers(3))
    dt = _fmt_date(date, ds)
    header = _pick(rng, (
        f"PROGRESS NOTE - Hospital day {day}\n{p.name} | MRN {p.mrn} | {dt}",
        f"Progress note {dt}: {p.name} ({p.age}{p.sex}), MRN {p.mrn}.",
        f"Daily progress note, HD#{day}. Patient {p.name}, MRN {p.mrn}, date {dt}.",
        f"{dt} Medicine progress note\nPt: {p.last}, {p.first}  MRN {p.mrn}",
    ))
    he, his = _pron(p)
    sym = _pick(rng, p.dx.symptoms)
    subj = _pick(rng, (
        f"{he.capitalize()} reports less {sym} today.",
        f"Feeling better overall; {sym} improving.",
        f"No acute events overnight. {his.capitalize()} {sym} persists but is milder.",
        f"Slept poorly, still bothered by {sym}.",
        f"Overnight {he} had {sym} and was seen by the cross-cover team.",
        f"States {he} is {_pick(rng, ('eating better', 'walking in the hallway', 'anxious about going home'))}.",
    ))
    exam = _pick(rng, p.dx.exam) if p.dx.exam else "unremarkable"
    obj = _vitals(p, rng) + " " + _pick(rng, ("Exam notable for ", "On exam: ", "Physical exam: ")) + exam + "."
    if rng.random() < 0.6:
        obj += " " + _labs(p, rng)
    plan_items = [_pick(rng, (f"Continue {m}", f"Day {day} of {m}", f"On {m}")) for m in _subset(rng, p.dx.inpatient, 1, 2)]
    plan_items += list(_subset(rng, p.dx.plan, 1, 2))
    if p.home_meds and rng.random() < 0.6:
        plan_items.append(f"Home {_pick(rng, p.home_meds)}")
    status = _pick(rng, ("improving", "clinically stable", "slowly improving", "unchanged from yesterday",
                         "tolerating treatment"))
    sw = _sexword(p, rng)
    assess = _pick(rng, (
        f"{p.age}-year-old {sw} with {p.dx.name}, {status}.",
        f"{p.dx.name.capitalize()}, {status}.",
        f"{p.age}{p.sex} admitted with {p.dx.name}; {status}.",
    ))
    plan_items = [x[0].upper() + x[1:] for x in plan_items]
    h = int(rng.integers(3))
    if h == 0:
        parts = [f"S: {subj}", f"O: {obj}", f"A/P: {assess}"] + [f"- {x}" for x in plan_items]
    elif h == 1:
        parts = [f"Subjective: {subj}", f"Objective: {obj}", f"Assessment and Plan: {assess} "
                 + " ".join(f"{i + 1}) {x}." for i, x in enumerate(plan_items))]
    else:
        parts = [f"SUBJECTIVE: {subj}", f"OBJECTIVE: {obj}", f"IMPRESSION: {assess}",
                 "PLAN: " + "; ".join(plan_items) + "."]
    extras = []
    if rng.random() < 0.25:
        extras.append(_allergy_line(p, rng))
    if rng.random() < 0.45:
        extras.append(_contact_line(p, rng))
    if rng.random() < 0.2:
        extras.append("Dispo: " + _pick(rng, ("anticipate discharge tomorrow", "continue inpatient care",
                                                "awaiting physical therapy evaluation", "discharge planning started")) + ".")
    rng.shuffle(extras)
    for e in extras:  # optional lines land at random places after the header
        parts.insert(int(rng.integers(0, len(parts) + 1)), e)
    return "\n".join([header] + parts)


def _patient_notes(p: _Patient, rng, k: int) -> list[tuple[str, str]]:
    """``k`` chronological notes for one patient: mostly progress notes during a stay, each
    stay ending in a discharge summary; a later readmission starts a new stay."""
    notes: list[tuple[str, str]] = []
    admit = p.admit
    day = 1
    for j in range(k):
        last = j == k - 1
        is_ds = (rng.random() < 0.75) if last else (rng.random() < 0.15)
        if is_ds:
            los = max(day, int(rng.integers(2, 9)))
            notes.append(("discharge_summary", _discharge_summary(p, rng, admit, admit + _dt.timedelta(days=los))))
            admit = admit + _dt.timedelta(days=los + int(rng.integers(14, 400)))
            day = 1
        else:
            notes.append(("progress_note", _progress_note(p, rng, admit + _dt.timedelta(days=day - 1), day)))
            day += int(rng.integers(1, 3))
    return notes


def generate_clinical_notes(*, num_patients: int, notes_per_patient: tuple[int, int] = (2, 5), seed: int):
    """Generate the synthetic clinical-notes corpus.

    Parameters (keyword-only):
        num_patients: number of synthetic patients (>= 1).
        notes_per_patient: inclusive range ``(low, high)``; each patient gets a uniform
            number of notes in it.
        seed: the corpus seed. Patient ``i`` is generated from
            ``numpy.random.SeedSequence([salt, seed, i])`` and a ``faker`` instance seeded
            from the same sequence, so the result is identical across processes.

    Returns:
        ``datasets.Dataset`` with columns ``text``, ``unit_id`` (the patient, e.g.
        ``"patient-00012"``), ``note_id`` (unique per row, e.g. ``"patient-00012-note-01"``)
        and ``note_type`` (``"discharge_summary"`` or ``"progress_note"``). Notes of one
        patient share the patient's name, MRN, phone and diagnoses.
    """
    import datasets

    if isinstance(num_patients, bool) or not isinstance(num_patients, (int, np.integer)) or num_patients < 1:
        raise InputError(f"num_patients must be a positive integer, got {num_patients!r}")
    try:
        lo, hi = (int(x) for x in notes_per_patient)
    except (TypeError, ValueError):
        raise InputError(f"notes_per_patient must be a pair (low, high), got {notes_per_patient!r}") from None
    if lo < 1 or hi < lo:
        raise InputError(f"notes_per_patient must satisfy 1 <= low <= high, got {notes_per_patient!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")

    width = max(5, len(str(int(num_patients) - 1)))
    from faker import Faker

    fake = Faker("en_US")
    texts, units, note_ids, types = [], [], [], []
    for i in range(int(num_patients)):
        ss = np.random.SeedSequence([_CORPUS_SALT, int(seed), i])
        rng = np.random.default_rng(ss)
        fake.seed_instance(int(ss.generate_state(1, dtype=np.uint32)[0]))
        pid = f"patient-{i:0{width}d}"
        p = _make_patient(pid, rng, fake)
        k = int(rng.integers(lo, hi + 1))
        for j, (ntype, text) in enumerate(_patient_notes(p, rng, k)):
            texts.append(text)
            units.append(pid)
            note_ids.append(f"{pid}-note-{j + 1:02d}")
            types.append(ntype)
    features = datasets.Features({
        "text": datasets.Value("string"),
        "unit_id": datasets.Value("string"),
        "note_id": datasets.Value("string"),
        "note_type": datasets.Value("string"),
    })
    return datasets.Dataset.from_dict(
        {"text": texts, "unit_id": units, "note_id": note_ids, "note_type": types}, features=features
    )


def random_patient_fields(*, rng: np.random.Generator, faker) -> dict[str, str]:
    """Fields of one fresh synthetic patient in the corpus's style, for PII-shaped canaries.

    Returns strings for ``name``, ``first_name``, ``last_name``, ``mrn``, ``phone``, ``dob``,
    ``age``, ``sex``, ``diagnosis``, ``medication``, ``date``, ``doctor`` and ``city``.
    ``faker`` must be a seeded ``faker.Faker`` instance; ``rng`` a NumPy Generator.
    """
    p = _make_patient("canary", rng, faker)
    meds = list(p.dx.discharge_meds) + p.home_meds
    ds = int(rng.integers(3))
    return {
        "name": p.name,
        "first_name": p.first,
        "last_name": p.last,
        "mrn": p.mrn,
        "phone": p.phone,
        "dob": _fmt_date(p.dob, ds),
        "age": str(p.age),
        "sex": "female" if p.sex == "F" else "male",
        "diagnosis": p.dx.name,
        "medication": _pick(rng, meds),
        "date": _fmt_date(p.admit, ds),
        "doctor": f"Dr. {p.attending}",
        "city": p.city,
    }
