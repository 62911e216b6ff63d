TITLE Two-state AMPA synapse released by NET_RECEIVE events

COMMENT
Written for kingen's tests in the style of event-driven synapses on ModelDB (not a copy of
one): each event sets the transmitter to Cmax for Cdur ms in NET_RECEIVE, and BREAKPOINT
ends the pulse.
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPAEV
    RANGE Cmax, Cdur, Alpha, Beta, g, gmax
    NONSPECIFIC_CURRENT i
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    Erev = 0 (mV)
    gmax = 100 (pS)
    Cmax = 1 (mM)
    Cdur = 1 (ms)
    Alpha = 1.1 (/mM /ms)
    Beta = 0.19 (/ms)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    C (mM)
    tpulse (ms)
}

STATE { Rc Ro }

INITIAL {
    C = 0
    tpulse = -1e9
    Rc = 1
}

BREAKPOINT {
    SOLVE kin METHOD sparse
    if (t > tpulse) {
        C = 0
    }
    g = gmax * Ro
    i = (1e-6) * g * (v - Erev)
}

KINETIC kin {
    ~ Rc <-> Ro (Alpha*C, Beta)
    CONSERVE Rc + Ro = 1
}

NET_RECEIVE (weight) {
    C = Cmax
    tpulse = t + Cdur
}
