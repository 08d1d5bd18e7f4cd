"""The prompt sets of benchmarks/structured.py: (prompt, JSON schema) pairs, made the same each run.

`extraction`: 8 short documents (invoices and shipping notices, fictional, values drawn from a
seeded generator), each with a schema of 16-18 fields to fill from it. `other`: schemas of other
kinds (enums, arrays, nested objects, numbers) over short texts.
"""

import random

_NAMES = ["Maria Gonzalez", "Tom Okafor", "Lena Fischer", "Arjun Mehta", "Chloe Martin", "Kenji Sato",
          "Ana Silva", "Peter Novak"]
_FIRMS = ["Northwind Traders Ltd.", "Blue Harbor Supply", "Kessler & Sons GmbH", "Orchid Logistics",
          "Summit Parts Co.", "Redwood Analytics", "Delta Components", "Helios Foods"]
_CITIES = [("Bristol", "United Kingdom", "GBP"), ("Lyon", "France", "EUR"), ("Austin", "United States", "USD"),
           ("Hamburg", "Germany", "EUR"), ("Leeds", "United Kingdom", "GBP"), ("Denver", "United States", "USD")]
# Strings are bounded, as real extraction schemas bound them: a 135M model copying a long number
# can repeat its digits until max_tokens, which measures a loop, not extraction.
_S = {"type": "string", "maxLength": 48}
_DATE = {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}
_N = {"type": "number", "minimum": 0, "maximum": 100000}
_I = {"type": "integer", "minimum": 0, "maximum": 999}


def _object(fields: dict) -> dict:
    return {"type": "object", "properties": fields, "required": list(fields), "additionalProperties": False}


INVOICE = _object({
    "invoice_number": _S, "issue_date": _DATE, "due_date": _DATE, "vendor_name": _S, "vendor_city": _S,
    "vendor_country": _S, "customer_name": _S, "customer_email": _S, "customer_company": _S,
    "po_number": _S, "line_items": _I, "subtotal": _N, "tax_rate_percent": _N, "tax": _N, "total": _N,
    "currency": {"enum": ["EUR", "USD", "GBP"]}, "payment_terms": _S, "notes": _S})
SHIPMENT = _object({
    "tracking_number": _S, "carrier": _S, "ship_date": _DATE, "expected_delivery": _DATE, "sender_company": _S,
    "sender_city": _S, "recipient_name": _S, "recipient_company": _S, "recipient_city": _S,
    "recipient_country": _S, "packages": _I, "weight_kg": _N, "declared_value": _N,
    "currency": {"enum": ["EUR", "USD", "GBP"]}, "signature_required": {"type": "boolean"},
    "instructions": _S})


def _invoice(r: random.Random) -> str:
    city, country, cur = r.choice(_CITIES)
    name, firm, client = r.choice(_NAMES), r.choice(_FIRMS), r.choice(_FIRMS)
    sub = r.randrange(200, 9000) + r.choice([0, 0.5, 0.25])
    rate = r.choice([5, 10, 20])
    month = r.randrange(1, 10)
    return (f"INVOICE #INV-{r.randrange(10000, 99999)}\nIssued: 2024-{month:02d}-{r.randrange(10, 28)}   "
            f"Due: 2024-{month + 1:02d}-{r.randrange(10, 28)}\nFrom: {firm}, {r.randrange(2, 90)} Harbour Road, "
            f"{city}, {country}\nBill to: {name} ({name.split()[0].lower()}.{name.split()[1].lower()}@example.com), "
            f"{client}\nPO number: PO-{r.randrange(10000, 99999)}\nItems: {r.randrange(1, 9)} line items\n"
            f"Subtotal: {sub:.2f} {cur}\nTax ({rate}%): {sub * rate / 100:.2f} {cur}\n"
            f"Total due: {sub * (1 + rate / 100):.2f} {cur}\nPayment terms: Net {r.choice([15, 30, 45])}\n"
            f"Notes: {r.choice(['Deliver to loading dock B.', 'Call ahead before delivery.', 'Thank you for your business.'])}")


def _shipment(r: random.Random) -> str:
    (c1, _, _), (c2, country, cur) = r.sample(_CITIES, 2)
    month = r.randrange(1, 12)
    return (f"SHIPPING NOTICE\nTracking: {r.choice(['1Z', 'JD', 'TB'])}{r.randrange(10**9, 10**10)}  Carrier: "
            f"{r.choice(['UPS', 'DHL Express', 'FedEx'])}\nShipped {2024}-{month:02d}-{r.randrange(10, 20)}, expected "
            f"{2024}-{month:02d}-{r.randrange(21, 28)}\nSender: {r.choice(_FIRMS)}, {c1}\nRecipient: {r.choice(_NAMES)}, "
            f"{r.choice(_FIRMS)}, {c2}, {country}\nPackages: {r.randrange(1, 6)}, total weight {r.randrange(2, 80)}.5 kg\n"
            f"Declared value: {r.randrange(100, 5000)}.00 {cur}\nSignature required: {r.choice(['yes', 'no'])}\n"
            f"Instructions: {r.choice(['Leave at reception.', 'Fragile: keep upright.', 'Do not stack.'])}")


def extraction(n: int = 8) -> list[tuple[str, dict]]:
    """(prompt, schema) pairs: fill every field of the schema from a short document."""
    r = random.Random(7)
    out = []
    for i in range(n):
        doc, schema = (_invoice(r), INVOICE) if i % 2 == 0 else (_shipment(r), SHIPMENT)
        out.append((f"Extract the fields of this document as JSON.\n\n{doc}", schema))
    return out


def other() -> list[tuple[str, dict]]:
    """(prompt, schema) pairs of other kinds: enums, arrays, nested objects, numbers."""
    return [
        ("Classify this support ticket and say why: 'My card was charged twice for the same order "
         "#4471 and I want a refund.'",
         _object({"category": {"enum": ["billing", "shipping", "technical", "account", "other"]},
                  "priority": {"enum": ["low", "medium", "high"]}, "reason": _S})),
        ("List the ingredients of this recipe: Whisk 2 eggs with 200 ml milk and 120 g flour, add a pinch "
         "of salt and 1 tbsp melted butter, rest 20 minutes, then fry thin pancakes.",
         _object({"ingredients": {"type": "array", "maxItems": 8,
                                  "items": _object({"name": _S, "quantity": _S})}})),
        ("Summarise the meeting: On 12 March, Priya, Tom and Lena agreed to ship version 2.1 on 3 April. "
         "Priya will update the release notes, Tom will fix the login bug, Lena will brief support.",
         _object({"date": _S, "attendees": {"type": "array", "items": _S, "maxItems": 6}, "decision": _S,
                  "action_items": {"type": "array", "items": _object({"owner": _S, "task": _S}), "maxItems": 6}})),
        ("Rate the sentiment of this review: 'The hotel was clean and the staff friendly, but the room "
         "was tiny and breakfast was cold.'",
         _object({"sentiment": {"enum": ["positive", "mixed", "negative"]},
                  "score": {"type": "number", "minimum": 0, "maximum": 1},
                  "pros": {"type": "array", "items": _S, "maxItems": 4},
                  "cons": {"type": "array", "items": _S, "maxItems": 4}})),
        ("Describe the person: Dr. Helen Carter, 47, a marine biologist at the Plymouth Institute, "
         "lives at 5 Quay Street, Plymouth, UK, and speaks English and Portuguese.",
         _object({"name": _S, "age": _I, "job": _S, "employer": _S,
                  "address": _object({"street": _S, "city": _S, "country": _S}),
                  "languages": {"type": "array", "items": _S, "maxItems": 4}})),
        ("Turn this into a calendar event: Dentist appointment next Tuesday 14 May 2024 at 9:30 for 45 "
         "minutes at Smile Clinic, 22 Baker Lane; remind me a day before.",
         _object({"title": _S, "date": _S, "start_time": _S, "duration_minutes": _I, "location": _S,
                  "reminder_hours_before": _I})),
    ]


SETS = {"extraction": extraction, "other": other}
