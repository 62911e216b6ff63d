TITLE Three-state AMPA receptor with rates in per second, converted by unit factors

COMMENT
Written for kingen's tests in the style of published ModelDB files (not a copy of one): the
rates are given per second and per micromolar, and a PROCEDURE that the KINETIC block calls
converts them with the factors (1e-3) and (1e3), as modlunit asks.
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPA3U
    RANGE Rb, Ru, Ro, Rc, g, gmax
    NONSPECIFIC_CURRENT i
    POINTER C
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
    (uM) = (micro/liter)
}

PARAMETER {
    Erev = 0 (mV)
    gmax = 20 (pS)
    Rb = 0.005 (/uM /ms)   : binding, 5 /mM /ms
    Ru = 2000 (/s)         : unbinding
    Ro = 4000 (/s)         : opening
    Rc = 1000 (/s)         : closing
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    C (mM)
    rb (/ms)
    ru (/ms)
    ro (/ms)
    rc (/ms)
}

STATE { C0 C1 O }

INITIAL {
    SOLVE kin STEADYSTATE sparse
}

BREAKPOINT {
    SOLVE kin METHOD sparse
    g = gmax * O
    i = (1e-6) * g * (v - Erev)
}

KINETIC kin {
    rates()
    ~ C0 <-> C1 (rb, ru)
    ~ C1 <-> O  (ro, rc)
    CONSERVE C0 + C1 + O = 1
}

PROCEDURE rates() {
    rb = Rb * (1e3) * C
    ru = Ru * (1e-3)
    ro = Ro * (1e-3)
    rc = Rc * (1e-3)
}
