from twisted.application.service import ServiceMaker

fleetd = ServiceMaker(
    "fleetd", "fleetd.tap", "Enroll and provision bare-metal Talos nodes.", "fleetd"
)
