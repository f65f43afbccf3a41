"""Built-in envfactory environments, one module per environment family.

Announced through the ``envfactory.environments`` entry point
(``builtin = "environments:register_all"``). Registration is lazy:
:func:`register_all` returns a table ``{environment name: module}`` and
envfactory imports a module only when one of its environments is first used
(``envfactory.make`` / ``envfactory.spec``); ``envfactory.specs()`` imports
them all. This package's ``__init__`` must therefore stay cheap: it imports
nothing from the environment modules.

Adding a module here means adding its environments to :data:`SINGLE_AGENT`
or :data:`MULTI_AGENT`, and adding a spec file under ``specs/`` a line to
:data:`SPEC_FILES` (``tests/test_imports.py`` checks the tables against what
the modules and files actually register, and names what is missing). A module
whose environments need a package envfactory does not depend on goes in
:data:`OPTIONAL`: its environments are announced only where that package is
installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["SINGLE_AGENT", "MULTI_AGENT", "SPEC_FILES", "OPTIONAL", "register_all", "import_all"]

_SPEC_FILES = "environments.spec_envs"   # a module per specs/*.yaml (and specs/composed/*.yaml)
_CLASSES = "environments.class_envs"     # one environment per classes/*.py

# environment name -> the module whose import registers it
SINGLE_AGENT: dict[str, str] = {
    "Bank-v0": "environments.bank",
    "Counter-v0": "environments.counter",
    "FileSystem-v0": "environments.filesystem",
    **{f"FindLight-v{d}": "environments.find_light" for d in range(4)},
    "Helpdesk-v0": "environments.helpdesk",
    "Lights-v0": "environments.lights",
    "RecordsDesk-v0": "environments.records_desk",
    "ServiceLine-v0": "environments.service_line",
    **{name: _CLASSES for name in (
        "GitRepo-v0", "LabBench-v0", "SmartHome-v0", "Social-v0", "Spreadsheet-v0", "TeamChat-v0",
        "Trading-v0", "Vehicle-v0",
    )},
}


# spec file (a module of environments.spec_envs: its stem, ``composed_<stem>`` under specs/composed/)
# -> the environments it declares (its ``name:`` and its variants'). Declared, not scanned, so
# announcing names reads no file; tests/test_imports.py checks it against what the files register.
SPEC_FILES: dict[str, tuple[str, ...]] = {
    "auto_repair": ("AutoRepair-v0",),
    "bike_share": ("BikeShare-v0",),
    "blood_bank": ("BloodBank-v0",),
    "bug_tracker": ("BugTracker-v0",),
    "calendar": ("Calendar-v0", "Calendar-v1"),
    "campground": ("Campground-v0",),
    "car_rental": ("CarRental-v0",),
    "catering": ("Catering-v0",),
    "cinema": ("Cinema-v0",),
    "city_permits": ("CityPermits-v0",),
    "clinic": ("Clinic-v0", "Clinic-v1"),
    "clinical_trials": ("ClinicalTrials-v0",),
    "courses": ("Courses-v0", "Courses-v1"),
    "coworking": ("Coworking-v0",),
    "crm": ("CRM-v0", "CRM-v1"),
    "crowdfunding": ("Crowdfunding-v0",),
    "daycare": ("Daycare-v0",),
    "dental": ("Dental-v0",),
    "dispatch": ("EmergencyDispatch-v0",),
    "donations": ("Donations-v0",),
    "events": ("Events-v0", "Events-v1"),
    "farm_ops": ("FarmOps-v0",),
    "fleet": ("Fleet-v0", "Fleet-v1"),
    "flights": ("Flights-v0", "Flights-v1"),
    "food_delivery": ("FoodDelivery-v0",),
    "gradebook": ("Gradebook-v0",),
    "grocery": ("GroceryDelivery-v0",),
    "gym": ("GymClub-v0", "GymClub-v1"),
    "hotel": ("Hotel-v0", "Hotel-v1"),
    "hr": ("HR-v0", "HR-v1"),
    "insurance": ("InsuranceClaims-v0",),
    "it_assets": ("ITAssets-v0",),
    "legal_cases": ("LegalCases-v0",),
    "library": ("Library-v0", "Library-v1"),
    "loans": ("Loans-v0",),
    "mailbox": ("Mailbox-v0", "Mailbox-v1"),
    "marina": ("Marina-v0",),
    "moving": ("MovingCompany-v0",),
    "museum": ("Museum-v0",),
    "parking": ("Parking-v0",),
    "payroll": ("Payroll-v0",),
    "pharmacy": ("Pharmacy-v0", "Pharmacy-v1"),
    "project_board": ("ProjectBoard-v0", "ProjectBoard-v1"),
    "publishing": ("Publishing-v0",),
    "rail": ("RailTickets-v0",),
    "real_estate": ("RealEstate-v0",),
    "recipes": ("Recipes-v0", "Recipes-v1"),
    "restaurant": ("Restaurant-v0", "Restaurant-v1"),
    "retail": ("RetailOrders-v0", "RetailOrders-v1"),
    "shelter": ("PetShelter-v0", "PetShelter-v1"),
    "sports_league": ("SportsLeague-v0",),
    "student_housing": ("StudentHousing-v0",),
    "subscriptions": ("Subscriptions-v0",),
    "tax_filing": ("TaxFiling-v0",),
    "telecom": ("Telecom-v0",),
    "translation": ("Translation-v0",),
    "tutoring": ("Tutoring-v0",),
    "utilities": ("UtilityBilling-v0",),
    "vet_clinic": ("VetClinic-v0",),
    "warehouse": ("Warehouse-v0", "Warehouse-v1"),
    "waste_collection": ("WasteCollection-v0",),
    "weddings": ("WeddingPlanner-v0",),
    "work_orders": ("WorkOrders-v0",),
    "composed_animal_care_network": ("AnimalCareNetwork-v0",),
    "composed_campus": ("Campus-v0",),
    "composed_care_network": ("CareNetwork-v0",),
    "composed_event_planner": ("EventPlanner-v0",),
    "composed_fleet_maintenance": ("FleetMaintenance-v0",),
    "composed_food_hub": ("FoodHub-v0",),
    "composed_home_buying": ("HomeBuying-v0",),
    "composed_home_services": ("HomeServices-v0",),
    "composed_kitchen": ("Kitchen-v0",),
    "composed_mobility_desk": ("MobilityDesk-v0",),
    "composed_people_ops": ("PeopleOps-v0",),
    "composed_sales_desk": ("SalesDesk-v0",),
    "composed_shop_back_office": ("ShopBackOffice-v0",),
    "composed_travel_desk": ("TravelDesk-v0",),
}
SINGLE_AGENT.update({name: f"{_SPEC_FILES}.{suffix}" for suffix, names in SPEC_FILES.items() for name in names})

# module -> (the package its environments are built from, the environments): announced (in
# SINGLE_AGENT) only where the package is installed; looking for it imports nothing
OPTIONAL: dict[str, tuple[str, tuple[str, ...]]] = {
    "environments.bfcl": ("bfcl_eval", ("BFCLMultiTurnBase-v0", "BFCLMultiTurnMissParam-v0",
                                        "BFCLMultiTurnMissFunc-v0", "BFCLMultiTurnLongContext-v0")),
}
for _module, (_package, _names) in OPTIONAL.items():
    if importlib.util.find_spec(_package) is not None:
        SINGLE_AGENT.update(dict.fromkeys(_names, _module))

# team environments (no Gymnasium id: they are PettingZoo environments)
MULTI_AGENT: dict[str, str] = {
    "GameAuction-v0": "environments.game_auction",
    "GameBattleship-v0": "environments.game_battleship",
    "MultiDeal-v0": "environments.multi_deal",
    "MultiMeeting-v0": "environments.multi_meeting",
    "MultiPipeline-v0": "environments.multi_pipeline",
    "MultiRecords-v0": "environments.multi_records",
    "MultiRooms-v0": "environments.multi_rooms",
    "MultiSupport-v0": "environments.multi_support",
}


def register_all() -> dict[str, Any]:
    """The lazy registration table: ``{name: module}`` for single-agent environments and
    ``{name: {"module": module, "multi_agent": True}}`` for team ones. Imports nothing."""
    table: dict[str, Any] = dict(SINGLE_AGENT)
    table.update({name: {"module": module, "multi_agent": True} for name, module in MULTI_AGENT.items()})
    return table


def import_all() -> None:
    """Import every built-in environment module now (each registers its specs)."""
    import importlib

    importlib.import_module(_SPEC_FILES)  # makes the per-file spec modules importable
    for module in sorted(set(SINGLE_AGENT.values()) | set(MULTI_AGENT.values())):
        importlib.import_module(module)
